"""History: the Stack's finished Jobs beyond ``Settings.job.history_limit``, and result
ConfigMaps whose Job is gone, are deleted after every pass.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from pkobatch.api.objects import job_finished
from pkobatch.api.timestamps import parse_time
from pkobatch.controller import approval
from pkobatch.controller.outcome import job_deleting
from pkobatch.controller.steps.draft import Draft, creation

# Result ConfigMaps whose Job is gone are deleted after this age (never a fresh one whose
# Job the cache has not shown yet).
ORPHAN_RESULT_AGE: Final = timedelta(minutes=10)


def prune_history(draft: Draft) -> None:
    """Keep the newest finished Jobs (never the current run, nor the preview Job holding a
    saved plan); delete old result ConfigMaps that outlived their Job."""
    current = draft.current_name()
    record = draft.status.get("approval") or {}
    kept = {current, record.get("previewJob") if approval.holds_plan(record) else None}
    done = [
        j
        for name, j in draft.jobs.items()
        if name not in kept and job_finished(j) and not job_deleting(j)
    ]
    done.sort(key=creation, reverse=True)
    for job in done[draft.settings.job.history_limit :]:
        draft.delete_job(job)
    for name, configmap in draft.obs.results.items():
        created = parse_time(creation(configmap))
        if (
            name not in draft.jobs
            and created is not None
            and draft.now - created > ORPHAN_RESULT_AGE
        ):
            draft.decision.delete_results.append(name)

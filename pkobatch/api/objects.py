"""``JSON``: a Kubernetes object, or a part of one, as the API server sends it."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

"""The ``pulumi.com/v1`` Stack API: PKO v2.9's spec and status, plus pkobatch's extensions.

One module per part, as Flux keeps its API types: ``spec`` (the spec models, ``StackSpec``),
``status`` (the status models and the whole ``Stack``), ``normalize`` (the alias dialect),
``validation`` (semantic checks, ``load_stack_spec``) and ``base`` (what all models share).

Attributes are snake_case, the wire names camelCase (``model_dump(by_alias=True)``). Models
are strict: a manifest that validates is exactly what the API server stores, so
``StackSpec.model_validate(d).to_manifest() == d`` for canonical manifests.

Checking a spec happens in three layers, from cheapest to richest:

1. **CRD schema + CEL** (``pkobatch.api.crd``): types, required fields, enums, and the
   cross-field rules that are cheap in CEL (source and branch/commit exclusivity, one git
   auth method). ``kubectl apply`` fails with a fix-it message.
2. **Model validation** (``spec.StackSpec.model_validate``, raises): the shape of every field
   and the values of pkobatch's own fields (cron syntax, IANA time zone, timeout > 0, Go
   duration). The alias dialect is normalised first (``normalize.normalize_spec``); an alias that
   disagrees with its canonical field is an error here.
3. **Semantic problems** (``validation.validate_stack_spec``, returns a list): relations between
   fields and PKO's rules that PKO itself reports as ``Stalled/SpecInvalid`` rather than
   rejecting at admission: git source completeness, ResourceRef type/field agreement,
   deprecated ``Env``/``FS`` refs, cross-namespace Secret refs. These repeat the CEL rules
   because objects stored before the CRD was installed, or by another operator's CRD, never
   went through them.

``load_stack_spec`` runs 2 and 3 and returns everything the controller needs to set
``Stalled/SpecInvalid`` or emit an alias Event.
"""

"""What every engine integration shares (SGLang's worker, vLLM's proposer).

* :mod:`.config`: :class:`~.config.LookaheadConfig`, which drafter an engine process builds;
* :mod:`.book`: :class:`~.book.RequestBook`, which tokens of each request the drafter holds;
* :mod:`.guard`: :class:`~.guard.DraftGuard`, a drafter step with a deadline that never fails
  the engine's step;
* :mod:`.session`: :class:`~.session.DraftSession`, the book and the guard stepped together: the
  one drafting loop of every engine (each adds only its own arrays);
* :mod:`.checks`: :func:`~.checks.draft_problem`, whether a drafter's tree may be proposed;
* :mod:`.warn_once`: :class:`~.warn_once.WarnOnce`, per-step problems logged once.

None of them imports an engine or torch.
"""

"""SGLang plugin entry: lookahead for ``sglang serve`` and any other SGLang launcher.

SGLang 0.5.23 runs every function registered under the entry-point group
``sglang.srt.plugins`` at the start of each of its processes (``load_plugins()``), the spawned
schedulers included. With this package's distribution declaring::

    [project.entry-points."sglang.srt.plugins"]
    lookahead = "lookahead_client.sglang.plugin:register"

setting ``LOOKAHEAD_SGLANG`` to a config (JSON, see
:meth:`~lookahead_client.engine.config.LookaheadConfig.to_env`; ``{}`` for the embedded
drafter) switches ``--speculative-algorithm NGRAM`` to lookahead. Unset, the plugin does
nothing. SGLang's ``SGLANG_PLUGINS`` variable can restrict which plugins load.
"""

from __future__ import annotations

import logging

from lookahead_client.engine.config import SGLANG_ENV as ENV_VAR
from lookahead_client.engine.config import LookaheadConfig
from lookahead_client.errors import InvalidArgumentError

__all__ = ["register"]

_log = logging.getLogger("lookahead_client.sglang")


def register() -> None:
    """Installs the lookahead hook when ``LOOKAHEAD_SGLANG`` holds a config.

    Raises:
        SystemExit: the variable is set but not a valid config; the message names the
            variable and the field. A typo must not leave lookahead off, and SGLang's
            ``load_plugins()`` logs and swallows a plugin's exceptions (the engine would start
            with SGLang's own corpus), not ``SystemExit``, which stops the process.
    """
    try:
        config = LookaheadConfig.from_env(ENV_VAR)
    except InvalidArgumentError as e:
        raise SystemExit(f"lookahead: {ENV_VAR} is invalid: {e}") from e
    if config is None:
        return
    from lookahead_client.sglang.activate import install

    install(config, apply=False)  # load_plugins() applies the hooks after every plugin ran
    _log.info("lookahead plugin: %s=%s", ENV_VAR, config.to_env())

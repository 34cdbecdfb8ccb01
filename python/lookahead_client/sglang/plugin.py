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

__all__ = ["register"]

_log = logging.getLogger("lookahead_client.sglang")


def register() -> None:
    """Installs the lookahead hook when ``LOOKAHEAD_SGLANG`` holds a config.

    Raises:
        InvalidArgumentError: the variable is set but not a valid config (a typo must not
            silently leave lookahead off; SGLang logs the error).
    """
    config = LookaheadConfig.from_env(ENV_VAR)
    if config is None:
        return
    from lookahead_client.sglang.activate import install

    install(config, apply=False)  # load_plugins() applies the hooks after every plugin ran
    _log.info("lookahead plugin: %s=%s", ENV_VAR, config.to_env())

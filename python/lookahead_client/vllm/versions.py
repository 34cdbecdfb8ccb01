"""Which vLLM versions lookahead runs on, and through which interface."""

from __future__ import annotations

__all__ = ["SUPPORTED", "check_version"]

#: vLLM versions (major.minor) by interface: the ``custom_class`` proposer of 0.32/0.33, the
#: registered ``lookahead`` method of 0.34.
SUPPORTED = {"custom_class": ("0.32", "0.33"), "speculator": ("0.34",)}


def check_version(interface: str) -> str | None:
    """vLLM's version, checked once at start against the versions ``interface`` supports
    (None when vLLM is not importable: nothing to check, the caller is not vLLM).

    Raises:
        RuntimeError: another vLLM, naming the supported versions and what to use instead.
    """
    try:
        import vllm
    except ImportError:
        return None

    version = str(vllm.__version__)
    minor = ".".join(version.split(".")[:2])
    if minor in SUPPORTED[interface]:
        return version
    other = next((i for i, v in SUPPORTED.items() if minor in v), None)
    use = {
        "custom_class": '"method": "custom_class" with "model": '
        '"lookahead_client.vllm.LookaheadProposer"',
        "speculator": '"method": "lookahead"',
    }
    hint = f"; on vLLM {version} use {use[other]}" if other else ""
    supported = ", ".join(v for versions in SUPPORTED.values() for v in versions)
    raise RuntimeError(
        f"lookahead's {interface} interface runs on vLLM {', '.join(SUPPORTED[interface])}, "
        f"not {version} (supported: {supported}){hint}"
    )

"""Suite-wide: the local-cpu preset uses its fixed figures, never this machine's probed ones (no test may
depend on how fast the machine is, nor write a probe cache into the user's home). tests/test_cpu_probe.py
re-enables the probe against a temporary cache directory where it tests it."""

from __future__ import annotations

import pytest

from paracube.topologies.cpu_probe import ENV_CACHE_DIR, ENV_NO_PROBE


@pytest.fixture(autouse=True)
def _fixed_local_cpu_figures(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv(ENV_NO_PROBE, "1")  # inherited by the subprocesses tests start (CLI, ranks)
    monkeypatch.setenv(ENV_CACHE_DIR, str(tmp_path_factory.getbasetemp() / "paracube-cache"))

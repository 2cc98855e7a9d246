"""docs/scaling.md: its examples run as written (URLs pointed at local servers)."""

from __future__ import annotations

from ._ray_support import require_ray

require_ray()

import re  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from .._processes import ServerProcess  # noqa: E402

pytestmark = pytest.mark.timeout(120)

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_every_example_compiles() -> None:
    """Each Python block of the guide is valid Python."""
    blocks = _blocks()
    assert len(blocks) == 2
    for code in blocks:
        compile(code, str(DOC), "exec")


def test_the_training_loop_runs(ray_local: Any, server_processes: list[ServerProcess],
                                capsys: pytest.CaptureFixture[str]) -> None:
    """The sync training loop of the guide runs against two servers on 2 shards."""
    code = _blocks()[0]
    assert "ray.init()  #" in code
    code = code.replace("ray.init()  #", "ray.init(ignore_reinit_error=True)  #")
    for old, proc in zip(["http://127.0.0.1:8000", "http://127.0.0.1:8001"],
                         server_processes, strict=True):
        assert old in code
        code = code.replace(old, proc.url)
    exec(compile(code, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "'sessions': 8" in out and "'active': 8" in out

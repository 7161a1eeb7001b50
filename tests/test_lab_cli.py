"""The ``varbnn`` command without and with the lab (issue 62): the experiments are the lab's (``varbnn_lab``, ``lab/``),
so ``varbnn.cli`` forwards ``list``, ``demo``, ``reproduce`` and ``render`` to ``varbnn_lab.cli`` where the lab is
importable, and says how to install it (exit status 2) where it is not; ``varbnn-lab`` is the lab's own command."""

from __future__ import annotations

import builtins
import sys

import pytest

from varbnn import cli


@pytest.fixture
def no_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import varbnn_lab`` fails as where only varbnn is installed (None in sys.modules: ModuleNotFoundError)."""
    for name in [m for m in sys.modules if m == "varbnn_lab" or m.startswith("varbnn_lab.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "varbnn_lab", None)


@pytest.mark.parametrize(
    "argv",
    [["reproduce", "mnist-mlp", "--quick", "--out", "x"], ["list"], ["demo", "--quick"], ["render", "x/mnist-mlp.json"]],
    ids=["reproduce", "list", "demo", "render"],
)
def test_without_the_lab_every_command_says_how_to_install_it(no_lab: None, argv: list[str], capsys) -> None:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"varbnn {argv[0]}: error: {cli.LAB_MISSING}" and not captured.out
    assert "pip install -e lab/" in cli.LAB_MISSING


def test_without_the_lab_help_still_lists_the_commands(no_lab: None, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in cli.COMMANDS), shown
    with pytest.raises(SystemExit) as exit_:
        cli.main(["nonsense"])
    assert exit_.value.code == 2


def test_a_missing_dependency_of_the_lab_is_not_reported_as_a_missing_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the lab's own absence gets the install message; any other missing module is the error to see."""
    real = builtins.__import__

    def fake(name: str, *args, **kwargs):
        if name == "varbnn_lab.cli":
            raise ModuleNotFoundError("No module named 'some_dependency'", name="some_dependency")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ModuleNotFoundError, match="some_dependency"):
        cli.main(["list"])


def test_with_the_lab_varbnn_forwards_to_the_labs_command(capsys) -> None:
    from varbnn_lab import cli as lab_cli
    from varbnn_lab.catalog import experiments

    assert cli.main(["list"]) == 0
    forwarded = capsys.readouterr().out
    assert lab_cli.main(["list"]) == 0
    assert forwarded == capsys.readouterr().out and len(forwarded.splitlines()) == len(experiments())
    with pytest.raises(SystemExit) as exit_:
        cli.main(["reproduce", "no-such-experiment"])
    assert exit_.value.code == 2 and "varbnn: error: unknown experiment 'no-such-experiment'" in capsys.readouterr().err


def test_varbnn_lab_is_the_labs_command_under_its_own_name(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from varbnn_lab import cli as lab_cli

    assert lab_cli.max_threads is cli.max_threads and lab_cli.DEVICE_CHOICES == cli.DEVICE_CHOICES
    monkeypatch.setattr(sys, "argv", ["varbnn-lab", "reproduce", "mnist-mlp", "--threads", "0"])
    with pytest.raises(SystemExit) as exit_:
        lab_cli.lab_main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith("varbnn-lab reproduce: error: --threads must be an integer in [1, ")

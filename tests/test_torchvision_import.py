"""``import torchvision, timm`` as the first line of a user's script works in the ``.venv`` that ``scripts/setup.sh``
makes (issue #73): PyPI's torchvision, compiled for CUDA torch, fails to import beside the CPU torch unless two op
schemas are declared first, which a ``.pth`` file does at start-up, lazily (``idg_models/_torchvision_hook.py``)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"

needs_venv = pytest.mark.skipif(not VENV_PYTHON.exists(), reason="needs the project's .venv (made by scripts/setup.sh)")


def _fresh(code: str, cwd: Path, python: Path | str = VENV_PYTHON, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` as a script of its own in ``cwd`` (outside the checkout: nothing of the project on the path but what
    the venv puts there), run by a fresh interpreter."""
    script = cwd / "mine.py"
    script.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return subprocess.run([str(python), *args, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@needs_venv
def test_a_users_script_imports_torchvision_and_timm_on_its_first_line(tmp_path: Path) -> None:
    done = _fresh("""\
        import torchvision, timm
        import torch

        net = torchvision.models.resnet18(num_classes=3).eval()
        prep = torchvision.models.ResNet18_Weights.DEFAULT.transforms()
        image = torchvision.transforms.functional.to_pil_image(torch.rand(3, 300, 200))
        with torch.no_grad():
            print("resnet18", tuple(net(prep(image).unsqueeze(0)).shape))
            print("timm", tuple(timm.create_model("resnet18", num_classes=3).eval()(torch.rand(1, 3, 64, 64)).shape))
        print("box_iou", round(torchvision.ops.box_iou(torch.tensor([[0.0, 0, 2, 2]]), torch.tensor([[1.0, 0, 3, 2]])).item(), 6))
        try:
            torchvision.ops.nms(torch.tensor([[0.0, 0, 1, 1]]), torch.tensor([1.0]), 0.5)
        except RuntimeError as err:
            print("nms", str(err).split(".")[0])
        else:
            print("nms works")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["resnet18 (1, 3)", "timm (1, 3)", f"box_iou {round(1 / 3, 6)}"], done.stdout
    # torchvision's own compiled detection ops: loaded where the build matches the torch, else its own clear refusal
    assert lines[3] in ("nms works", "nms Couldn't load custom C++ ops"), done.stdout


@needs_venv
def test_the_venvs_start_up_stays_cheap(tmp_path: Path) -> None:
    """The .pth file puts a finder in place and imports nothing heavy: torch is imported by torchvision, when it is."""
    done = _fresh("""\
        import sys
        print("torch" in sys.modules, "idg_models" in sys.modules, "logging" in sys.modules)
        print(sum(getattr(f, "idg_torchvision_finder", False) for f in sys.meta_path))
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "False", "1"], done.stdout


@needs_venv
def test_import_torchvision_works_where_no_pth_file_put_the_finder(tmp_path: Path) -> None:
    """Outside the .venv's start-up (python -S: no site-packages, no .pth): a bare import fails beside the CPU torch,
    and ``idg_models.import_torchvision()`` mends it even after that failure."""
    site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    done = _fresh(f"""\
        import sys
        sys.path[:0] = [{str(ROOT)!r}, {str(site)!r}]
        try:
            import torchvision
            print("bare import works")
        except RuntimeError as err:
            print("bare import fails:", err)
        from idg_models import import_torchvision
        version = import_torchvision().__version__
        import timm
        print(version.split("+")[0], timm.__name__)
    """, tmp_path, VENV_PYTHON, "-S")
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first in ("bare import works", "bare import fails: operator torchvision::nms does not exist"), first
    assert second == "0.28.0 timm", done.stdout


def test_setup_writes_the_pth_file_once_into_the_venvs_site_packages(tmp_path: Path) -> None:
    """setup.sh (in a copy with a stub venv) writes the file naming this checkout's hook, and says so only when it does."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (repo / ".venv" / ".installed-base").touch()  # installed: only the .pth file is left to do

    def setup() -> str:
        return subprocess.run(["bash", "scripts/setup.sh"], cwd=repo, capture_output=True, text=True, timeout=60, check=True).stderr

    assert "idg_torchvision.pth" in setup()
    line = (site / "idg_torchvision.pth").read_text()
    assert line.startswith("import ") and f"'{repo / 'idg_models' / '_torchvision_hook.py'}'" in line
    assert setup() == ""
    # the line runs as Python runs it at start-up (-S: not this venv's own); with the hook file absent (a moved
    # checkout) it does nothing
    done = subprocess.run([sys.executable, "-S", "-c", line.strip() + "\nimport sys; print(len(sys.meta_path))"], capture_output=True,
                          text=True, timeout=60, check=True)
    baseline = subprocess.run([sys.executable, "-S", "-c", "import sys; print(len(sys.meta_path))"], capture_output=True, text=True,
                              timeout=60, check=True)
    assert done.stdout == baseline.stdout and done.stderr == ""
    (repo / "idg_models").mkdir()
    shutil.copy(ROOT / "idg_models" / "_torchvision_hook.py", repo / "idg_models")
    done = subprocess.run([sys.executable, "-S", "-c", line.strip() + "\nimport sys; print(len(sys.meta_path))"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert int(done.stdout) == int(baseline.stdout) + 1

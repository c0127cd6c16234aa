"""How much of IDG's importance factor survives bf16: the finite differences of the target logit along a straight
64-point path (black baseline), bf16 autocast against IEEE fp32, and with the classifier's last Linear kept in fp32.

    python results/benchmarks/cpu-bf16-logit-steps-2026-11-27/logit_steps.py [N]   (from the checkout, N sample photos)
"""

import glob
import sys

import torch
from PIL import Image
from torch import nn

from idg_models.zoo import load_model


class Float32(nn.Module):
    """``inner`` outside autocast, on float32 inputs."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return self.inner(x.float())


def main() -> None:
    torch.set_num_threads(1)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    model = load_model("efficientnet_lite0").eval()
    name, last = [(k, m) for k, m in model.net.named_modules() if isinstance(m, nn.Linear)][-1]
    parent = model.net
    *path, leaf = name.split(".")
    for part in path:
        parent = getattr(parent, part)
    print("| photo | logit (fp32) | zero steps bf16 / fp32 head / fp32 | L1 error of the steps: bf16 | fp32 head |")
    print("|---|---|---|---|---|")
    for file in sorted(glob.glob("../shared/data/imagenet-samples/*"))[:n]:
        x = model.prepare(Image.open(file).convert("RGB"))
        with torch.no_grad():
            top = int(model(x.unsqueeze(0)).argmax())
            points = torch.linspace(0, 1, 64).view(-1, 1, 1, 1) * x.unsqueeze(0)
            model.autocast_dtype = None
            fp32 = model(points)[:, top].double()
            model.autocast_dtype = torch.bfloat16
            bf16 = model(points)[:, top].double()
            setattr(parent, leaf, Float32(last))
            head = model(points)[:, top].double()
            setattr(parent, leaf, last)
            model.autocast_dtype = None
        want = fp32.diff()

        def error(steps: torch.Tensor, want: torch.Tensor = want) -> float:
            return float((steps - want).abs().sum() / want.abs().sum())

        print(f"| {file.rsplit('/', 1)[-1]} | {float(fp32[-1]):.2f} | {int((bf16.diff() == 0).sum())} / {int((head.diff() == 0).sum())} / "
              f"{int((want == 0).sum())} of 63 | {error(bf16.diff()):.2f} | {error(head.diff()):.2f} |")


if __name__ == "__main__":
    main()

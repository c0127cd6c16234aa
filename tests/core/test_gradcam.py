"""Grad-CAM and Grad-CAM++ (``gradcam``, ``gradcam_pp``): the map of a global-average-pooled head worked out by hand,
one forward and one backward pass, the layer found (or named) the same on a plain module, an ImageClassifier, a tuned
(folded and fused) network, torchvision's, timm's and the zoo's models, a clear error where there is none, and each map
held against ``pytorch-grad-cam`` 1.5.7 itself on the same layer (installed apart by ``scripts/setup.sh dev`` into
``.venv/peers/gradcam``, loaded and hooked as the benchmark does it: :mod:`benchmarks.gradcam_peer`; those comparisons
skip where it is absent)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from benchmarks.gradcam_peer import load_peer, peer_cam, peer_target
from idg_core.budget import WorkBound
from idg_core.methods import METHODS, gradcam, gradcam_plan, gradcam_pp, ig_plan
from idg_core.model_calls import CallStats, run_plans
from idg_models.models_file import parse_table
from idg_models.zoo import ImageClassifier, Preprocessing

IDENTITY = Preprocessing(8, 6, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


def _peer() -> Any:
    """``pytorch_grad_cam`` from its folder apart (:func:`benchmarks.gradcam_peer.load_peer`: .venv's torch and numpy
    stay first); the test skips where it is absent."""
    peer = load_peer()
    if peer is None:
        pytest.skip("pytorch-grad-cam is not installed apart (scripts/setup.sh dev puts it in .venv/peers/gradcam)")
    return peer


def _gap_net(seed: int = 0) -> nn.Sequential:
    """conv 3x3 (same size) -> ReLU -> global average pool -> linear: the CAM's own setting, 4 channels, 3 classes."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)).eval()


def _strided_net(seed: int = 0) -> nn.Sequential:
    """A map at half the input's size (so the upsampling shows), a hidden layer after the pooling."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 5)).eval()


def _scaled(maps: Tensor) -> Tensor:
    """Each ``(H, W)`` map min-max scaled to [0, 1], as pytorch-grad-cam's ``scale_cam_image`` (without its 1e-7)."""
    flat = maps.flatten(1)
    low = flat.min(1, keepdim=True).values
    return ((flat - low) / (flat - low).max(1, keepdim=True).values).view_as(maps)


def _assert_peer(ours: Tensor, theirs: Tensor, atol: float) -> None:
    """Our maps (unscaled) against pytorch-grad-cam's: the same after scaling, but for its ``/ (1e-7 + max)``, which
    shrinks a map whose largest value is ``m`` by up to ``1e-7 / m`` of its range."""
    for mine, peer in zip(ours, theirs, strict=True):
        torch.testing.assert_close(_scaled(mine[None])[0], peer, rtol=0, atol=atol + 2e-7 / float(mine.max()))


def _head(net: nn.Sequential) -> Tensor:
    """The weights of :func:`_gap_net`'s linear layer."""
    linear = net[4]
    assert isinstance(linear, nn.Linear)
    return linear.weight


def _expected(net: nn.Sequential, x: Tensor, target: int, plus: bool) -> Tensor:
    """The CAM of :func:`_gap_net` by hand, in float64: ``A = ReLU(conv(x))``; the pooled head makes the target's
    gradient ``W[t, k] / (h w)`` at every position."""
    a = net[1](net[0](x)).double()[0]
    g = (_head(net)[target].double() / (a.shape[1] * a.shape[2])).view(-1, 1, 1).expand_as(a)
    if plus:
        alpha = torch.where(g != 0, g**2 / (2 * g**2 + a.sum((1, 2), keepdim=True) * g**3 + 1e-6), torch.zeros_like(g))
        weights = (torch.relu(g) * alpha).sum((1, 2))
    else:
        weights = g.mean((1, 2))
    return torch.relu((weights.view(-1, 1, 1) * a).sum(0))


@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("wrapped", [False, True])
def test_on_a_pooled_head_the_map_is_the_class_activation_map_in_one_pass_each_way(plus: bool, wrapped: bool) -> None:
    net = _gap_net()
    model: nn.Module = ImageClassifier("gap", net, IDENTITY, ["a", "b", "c"]).eval() if wrapped else net
    x = torch.rand(2, 3, 6, 6)
    method = gradcam_pp if plus else gradcam
    res = method(model, x, None, [2, 0])
    assert res.attributions.shape == x.shape and (res.attributions >= 0).all()
    assert torch.equal(res.attributions[:, 0], res.attributions[:, 2])  # each channel holds 1/C of the map
    for i, target in enumerate([2, 0]):
        expected = _expected(net, x[i : i + 1], target, plus)
        assert expected.max() > 0
        torch.testing.assert_close(res.attributions[i].sum(0).double(), expected, rtol=1e-5, atol=1e-7)
    assert (res.forward_passes, res.backward_passes) == (2, 2)  # two images: one pass each way apiece
    name = "gradcam_pp" if plus else "gradcam"
    assert METHODS[name].bound(METHODS[name].validate()) == WorkBound(1, 1)


def test_a_cam_row_shares_a_model_call_with_other_methods_rows_and_answers_as_alone() -> None:
    net = _strided_net()
    x = torch.rand(2, 3, 8, 8)
    alone = gradcam(net, x[:1], None, 1).attributions
    stats = CallStats()
    cam, ig = run_plans(net, [gradcam_plan(x[0], torch.zeros(3, 8, 8), 1), ig_plan(x[1], torch.zeros(3, 8, 8), 3, steps=5)], 64, stats)
    assert stats.calls == 1 and stats.backward_images == 6  # the CAM's row and IG's five in one call with gradients
    torch.testing.assert_close(cam.attributions, alone, rtol=1e-5, atol=1e-7)
    assert ig.attributions.abs().sum() > 0


def test_a_named_layer_is_the_one_read_and_a_wrong_name_is_refused() -> None:
    net = _gap_net()
    x = torch.rand(1, 3, 6, 6)
    named = ImageClassifier("gap", net, IDENTITY, ["a", "b", "c"]).eval()
    named.cam_layer = "0"  # the convolution, before its ReLU: the gradient there is masked by the ReLU
    res = gradcam(named, x, None, 1).attributions[0].sum(0).double()
    z = net[0](x).double()[0]
    g = (z > 0).double() * (_head(net)[1].double() / 36).view(-1, 1, 1)
    torch.testing.assert_close(res, torch.relu((g.mean((1, 2)).view(-1, 1, 1) * z).sum(0)), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(res, _expected(net, x, 1, plus=False))
    for name, why in (("9", "not a module of the served network"), ("4", r"gives no \(batch, channels, height, width\) map")):
        wrong = ImageClassifier("gap", _gap_net(), IDENTITY, ["a", "b", "c"]).eval()
        wrong.cam_layer = name
        with pytest.raises(ValueError, match=why):
            METHODS["gradcam"].check_model(wrong)  # type: ignore[misc]  # declared: the service's 422
        with pytest.raises(ValueError, match=why):
            gradcam(wrong, x, None, 0)


def test_the_models_file_names_the_layer() -> None:
    assert parse_table("t", {"cam_layer": "features.8"}, Path(".")).cam_layer == "features.8"
    with pytest.raises(ValueError, match="cam_layer must be"):
        parse_table("t", {"cam_layer": 8}, Path("."))


class _Tokens(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(2).transpose(1, 2)


class _Mean(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.mean(1)


def test_a_model_without_a_spatial_map_or_a_transformer_is_refused_with_why() -> None:
    x = torch.rand(1, 3, 8, 8)
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(192, 4)).eval()
    vit = nn.Sequential(nn.Conv2d(3, 6, 4, stride=4), _Tokens(), nn.Linear(6, 6), _Mean(), nn.Linear(6, 4)).eval()
    for net, why in ((mlp, "no spatial feature map"), (vit, "vision transformer .* 4 tokens")):
        with pytest.raises(ValueError, match=why):
            gradcam(net, x, None, 0)
        served = ImageClassifier("m", net, Preprocessing(8, 8), list("abcd")).eval()
        with pytest.raises(ValueError, match=why):
            METHODS["gradcam_pp"].check_model(served)  # type: ignore[misc]
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        gradcam(lambda t: mlp(t), x, None, 0)
    scripted = torch.jit.script(_strided_net())  # its modules take no hook: refused, not a RuntimeError (a 500)
    with pytest.raises(ValueError, match="TorchScript or torch.export file runs as one graph"):
        gradcam(scripted, x, None, 0)


def test_the_layer_found_in_torchvision_and_timm_classifiers() -> None:
    from idg_models import import_torchvision

    tv = import_torchvision().models
    timm = pytest.importorskip("timm")
    for net, layer in ((tv.resnet18(num_classes=4), "layer4"), (tv.mobilenet_v3_small(num_classes=4), "features"),
                       (timm.create_model("resnet18", pretrained=False, num_classes=4), "layer4")):
        model = ImageClassifier("m", net.eval(), Preprocessing(64, 64), list("abcd")).eval()
        assert model.cam_target()[1] is net.get_submodule(layer)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=4, img_size=32)
    with pytest.raises(ValueError, match="vision transformer"):
        ImageClassifier("vit", vit.eval(), Preprocessing(32, 32), list("abcd")).eval().cam_target()


@pytest.mark.parametrize("name", ["gradcam", "gradcam_pp"])
def test_the_maps_are_pytorch_grad_cams_on_the_same_layer(name: str) -> None:
    gc = _peer()
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget  # type: ignore[import-not-found]

    peer_cls = gc.GradCAM if name == "gradcam" else gc.GradCAMPlusPlus
    net = _strided_net(seed=3)
    x = torch.rand(3, 3, 8, 8)
    targets = [4, 0, 2]
    ours = METHODS[name](net, x, None, targets).attributions.sum(1)
    with peer_cls(model=net, target_layers=[net[3]]) as cam:
        theirs = torch.from_numpy(cam(input_tensor=x, targets=[ClassifierOutputTarget(t) for t in targets]))
    assert theirs.shape == (3, 8, 8) and theirs.amax() > 0.99
    _assert_peer(ours, theirs, 2e-6)


@pytest.mark.slow
def test_efficientnet_lite0s_maps_are_pytorch_grad_cams_on_the_heads_bn_and_relu6_served_or_not() -> None:
    from idg_models import efficientnet_lite
    from idg_models.fuse import FusedConvActivation
    from idg_models.speed import fold_batchnorm, tuned

    model = efficientnet_lite("efficientnet_lite0")
    assert model.cam_target()[1] is model.net._swish  # its last call: the head's, after the BN
    x = torch.rand(2, 3, 224, 224)
    targets = [281, 7]
    ours = {n: METHODS[n](model, x, None, targets).attributions.sum(1) for n in ("gradcam", "gradcam_pp")}
    served = tuned(copy.deepcopy(model))  # batch norm folded, each convolution fused with its ReLU6: the same map
    for n, maps in ours.items():
        torch.testing.assert_close(_scaled(METHODS[n](served, x, None, targets).attributions.sum(1)), _scaled(maps), rtol=0, atol=2e-3)
    gc = _peer()
    # hooked as the benchmark hooks it (benchmarks/gradcam_peer.py peer_target): as loaded, head_apart's copy, whose
    # head's ReLU6 is a module of its own; with batch norm folded (a torch.fx graph), the same; as served on the CPU,
    # the head's fused convolution itself, called once
    peer, layer = peer_target(model)
    assert peer is not model and layer is peer.net.get_submodule("_head_act")
    for n in ("gradcam", "gradcam_pp"):
        with peer_cam(gc, n, peer, layer) as cam:
            _assert_peer(ours[n], torch.from_numpy(cam(x, targets)), 1e-5)  # measured: 1e-6
    folded = copy.deepcopy(model)
    folded.net = fold_batchnorm(folded.net)
    for net, kind in ((folded, nn.ReLU6), (served, FusedConvActivation)):
        peer, layer = peer_target(net)
        assert type(layer) is kind and (peer is net) == (kind is FusedConvActivation)
        with peer_cam(gc, "gradcam", peer, layer) as cam:
            _assert_peer(ours["gradcam"], torch.from_numpy(cam(x, targets)), 2e-3)  # the served map's rounding, as above


def test_a_compiled_network_gives_its_cam_uncompiled_and_compiles_nothing_for_it() -> None:
    from idg_models.compiled import FixedBatchCompiled

    net = _strided_net()
    x = torch.rand(1, 3, 8, 8)
    plain = ImageClassifier("s", net, Preprocessing(8, 8, mean=(0.0,) * 3, std=(1.0,) * 3), list("abcde")).eval()
    expected = gradcam(plain, x, None, 2).attributions
    compiled = ImageClassifier("s", FixedBatchCompiled(net, (2,), backend="eager"), plain.preprocessing, list("abcde")).eval()
    torch.testing.assert_close(gradcam(compiled, x, None, 2).attributions, expected, rtol=0, atol=0)
    assert compiled.cam_target()[1] is net[3] and compiled.net.graphs == 0  # the hook's forward pass ran the network itself


@pytest.mark.parametrize("named", [None, "1"])
def test_on_the_simulated_device_the_layers_search_books_no_call_and_the_cam_call_does(named: str | None) -> None:
    """The search's probe runs the simulated device's own network (a probe the service's start makes outside the worker
    was booked on the device's timeline, and the first request's call waited behind it); a models file's name is the
    network's own, as on the device; the CAM itself is a served call, booked."""
    from idg_serving.simulated import SimulatedAccelerator

    net = _gap_net()
    x = torch.rand(1, 3, 6, 6)
    plain = ImageClassifier("gap", net, IDENTITY, ["a", "b", "c"]).eval()
    plain.cam_layer = named
    expected = gradcam(plain, x, None, 1).attributions
    device = SimulatedAccelerator(net, call_ms=0.0, stream=True)
    served = ImageClassifier("gap", device, IDENTITY, ["a", "b", "c"]).eval()
    served.cam_layer = named
    assert served.cam_target()[1] is net[1] and device.calls == 0
    torch.testing.assert_close(gradcam(served, x, None, 1).attributions, expected, rtol=0, atol=0)
    assert device.calls == 1


def test_the_evaluation_takes_the_cam_methods_as_rows(tmp_path: Path) -> None:
    from PIL import Image

    from idg_evaluation import EvalConfig, evaluate_folder
    from idg_evaluation.runner import parse_row
    from tests.models import tiny_classifier

    paths = []
    for i, wnid in enumerate(("n01440764", "n01580077")):
        img = Image.new("RGB", (40, 36), (60 * i, 200 - 50 * i, 90))
        for j in range(30):
            img.putpixel((j, (j * 7) % 36), (255, 255 - 80 * i, 0))
        paths.append(tmp_path / f"{wnid}_{i}.png")
        img.save(paths[-1])
    rows = {"gradcam": parse_row("gradcam"), "gradcam_pp@fast": parse_row("gradcam_pp@fast")}
    assert rows == {"gradcam": ("gradcam", {}), "gradcam_pp@fast": ("gradcam_pp", {})}
    cfg = EvalConfig(model="tiny", methods=rows, rise_step=128, pic_min_confidence=0.0, batch_size=16)
    records = evaluate_folder(tiny_classifier(), paths, tmp_path / "out", cfg, workers=0, progress=False)
    for record in records:
        for row in rows:
            scores = record["methods"][row]
            assert 0 <= scores["insertion"] <= 1 and 0 <= scores["deletion"] <= 1


def test_a_models_files_cam_layer_is_the_one_served_and_a_wrong_one_stops_the_load() -> None:
    pytest.importorskip("timm")
    from idg_models.models_file import ModelSettings
    from idg_models.sources import load_source, parse_spec

    spec = parse_spec("r=timm:resnet18:random")
    model = load_source(spec, ModelSettings(cam_layer="layer3", input_size=64))
    assert model.cam_layer == "layer3" and model.cam_target()[1] is model.net.get_submodule("layer3")
    found = load_source(spec, ModelSettings(input_size=64))
    assert found.cam_target()[1] is found.net.get_submodule("layer4")
    with pytest.raises(ValueError, match="'layer9' is not a module"):
        load_source(spec, ModelSettings(cam_layer="layer9", input_size=64))

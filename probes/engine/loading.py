"""Local-only model loading.

Models come from a local directory, a name already in the local Hugging Face cache, or a GGUF
file (converted once into a cached HF folder). Nothing here touches the network: every
transformers / huggingface_hub call uses ``local_files_only=True``. Weights must be safetensors
unless ``allow_pickle=True`` (pickle checkpoints can execute code on load), and remote code is
off unless ``trust_remote_code=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from probes.core.files import OutputRoot, write_text

DTYPES: dict[str, torch.dtype | str] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "auto": "auto",
}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# A bare "name" or "org/name" that does not exist on disk is read as a hub id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelLoadError(ValueError):
    """A model could not be loaded; the message says exactly why and what to do."""


class PromptTooLongError(ValueError):
    """A prompt does not fit the model's context window."""


def gguf_cache_dir() -> Path:
    """Where converted GGUF models live (``$BASM_PROBES_CACHE`` or ~/.cache/basm-probes)."""
    root = os.environ.get("BASM_PROBES_CACHE") or Path.home() / ".cache" / "basm-probes"
    return Path(root) / "gguf"


def _has_safetensors(d: Path) -> bool:
    return any(d.glob("*.safetensors")) or (d / "model.safetensors.index.json").exists()


def _pickle_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.suffix in PICKLE_SUFFIXES)


def _check_model_dir(d: Path, allow_pickle: bool) -> None:
    if not (d / "config.json").is_file():
        raise ModelLoadError(f"{d} has no config.json; it is not a Hugging Face model directory")
    if _has_safetensors(d):
        return
    pickles = _pickle_files(d)
    if pickles and not allow_pickle:
        raise ModelLoadError(
            f"{d} has only pickle weights ({', '.join(pickles)}); pickle can run arbitrary code on load. "
            "Convert them to safetensors, or pass --allow-pickle (allow_pickle=True) if you trust the source"
        )
    if not pickles:
        raise ModelLoadError(f"{d} has a config.json but no weights (no *.safetensors, no {'/'.join(PICKLE_SUFFIXES)} files)")


def _hub_cache_lookup(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError) as e:
        raise ModelLoadError(
            f"{name!r} is not a local directory and is not in the local Hugging Face cache ({HF_HUB_CACHE}). "
            "basm-probes runs offline and never downloads: fetch it first (e.g. `huggingface-cli download "
            f"{name}`) or pass the path of a local model directory"
        ) from e


def resolve_model_dir(model: str | Path, *, allow_pickle: bool = False) -> Path:
    """The local HF model directory for ``model`` (a path or a cached hub name); checked, not loaded.

    ``.gguf`` files are handled by :func:`load_model` (they are converted first).
    """
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; expected a model directory or a .gguf file")
        d = path
    elif isinstance(model, str) and _HUB_ID.match(model) and not model.startswith("."):
        d = _hub_cache_lookup(model)
    else:
        raise ModelLoadError(f"model directory {path} does not exist")
    _check_model_dir(d, allow_pickle)
    return d


def hash_cache_path() -> Path:
    """The sidecar memo of file hashes (``$BASM_PROBES_CACHE`` or ~/.cache/basm-probes/hashes.json).

    It lives in the user's cache folder, never in the model folder (which may be read-only, shared,
    or a Hugging Face cache snapshot that other tools verify), and is only a memo: deleting it costs
    one rehash of each file."""
    return gguf_cache_dir().parent / "hashes.json"


SAMPLE_BLOCKS = 16  # blocks read from every file on each fingerprint, spread over it, first and last included
SAMPLE_BLOCK_SIZE = 1 << 16


def _sampled_digest(handle: Any, size: int) -> str:
    """SHA-256 of ``SAMPLE_BLOCKS`` blocks spread evenly over the file (the whole file when small)."""
    h = hashlib.sha256()
    if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK_SIZE:
        h.update(handle.read())
        return h.hexdigest()
    step = (size - SAMPLE_BLOCK_SIZE) / (SAMPLE_BLOCKS - 1)
    for i in range(SAMPLE_BLOCKS):
        handle.seek(int(i * step))
        h.update(handle.read(SAMPLE_BLOCK_SIZE))
    return h.hexdigest()


def _memo_key(path: Path, st: os.stat_result, sampled: str) -> str:
    """What a memoised hash is valid for: the file (device, inode, path), its size, mtime and ctime
    (``touch`` restores an mtime, not a ctime: any write or metadata change moves it), and the hash
    of sampled blocks of its content."""
    return f"{path.resolve()}|{st.st_dev}:{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{sampled[:32]}"


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _read_memo(index: Path) -> dict[str, str]:
    """The memo's entries that are SHA-256 hex digests: any other value is hashed again, never used as a
    fingerprint; a memo that is not a JSON object (torn, edited, nested past the parser's depth) is
    rebuilt. Either is said on stderr, since the memo is then rewritten without it."""
    try:
        memo = json.loads(index.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: 200,000 "[" overflow the parser's stack
        memo, problem = {}, f"unreadable or not JSON ({type(error).__name__})"
    else:
        if not isinstance(memo, dict):
            memo, problem = {}, f"a JSON {type(memo).__name__}, not an object"
        else:
            kept = {key: value for key, value in memo.items() if isinstance(value, str) and _SHA256_HEX.fullmatch(value)}
            if len(kept) == len(memo):
                return kept
            memo, problem = kept, f"{len(memo) - len(kept)} of its entries are not SHA-256 hex digests"
    print(f"warning: hash memo {index}: {problem}; those files are hashed again and the memo rewritten", file=sys.stderr)
    return memo


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's whole content, memoised in the sidecar :func:`hash_cache_path` under
    :func:`_memo_key` (inode, size, mtime, ctime and sampled blocks), so large weights are read in
    full once: a tensor changed in place, with its mtime restored, is hashed again.

    Cost (measured on a shared 2-core Xeon with SHA-NI: 575 MB/s in memory, 470 MB/s from the page
    cache): about 30-35 s of CPU for an 8B checkpoint (~16 GB in bf16) the first time, or the disk's
    read time if slower; later runs read only 16 × 64 KiB per file.
    """
    index = hash_cache_path()
    with open(path, "rb") as handle:  # one open: the stat and the samples describe the same file
        st = os.fstat(handle.fileno())
        key = _memo_key(path, st, _sampled_digest(handle, st.st_size))
        memo = _read_memo(index)
        if key in memo:
            return memo[key]
        handle.seek(0)
        h = hashlib.sha256()
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            h.update(chunk)
    memo[key] = h.hexdigest()
    try:
        write_text(index, json.dumps(memo, indent=1))  # atomic: concurrent runs never read a half-written memo
    except OSError:  # a read-only cache folder: the hash is still right, only not remembered
        pass
    return memo[key]


WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", *(f"*{s}" for s in PICKLE_SUFFIXES), "config.json", "generation_config.json")
TOKENIZER_FINGERPRINT_FILES = (*TOKENIZER_FILES, "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def _files_digest(d: Path, patterns: tuple[str, ...]) -> str:
    files = sorted({p for pattern in patterns for p in d.glob(pattern) if p.is_file()})
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()[:16]


def model_fingerprint(model_dir: str | Path, tokenizer: Any = None) -> dict[str, str]:
    """Content hashes of what a row depends on in the model folder: ``weights`` (weight files and
    config) and ``tokenizer`` (tokenizer files plus the chat template actually in use)."""
    d = Path(model_dir)
    tok = hashlib.sha256(_files_digest(d, TOKENIZER_FINGERPRINT_FILES).encode())
    tok.update(str(getattr(tokenizer, "chat_template", None)).encode())
    return {"weights": _files_digest(d, WEIGHT_FILES), "tokenizer": tok.hexdigest()[:16]}


def gguf_folder(path: str | Path) -> Path:
    """The cached HF folder a GGUF file is converted into (named by the file's content hash)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {path} does not exist")
    return gguf_cache_dir() / file_sha256(path)


def model_folder(model: str | Path, *, allow_pickle: bool = False) -> Path:
    """The folder ``model`` (a folder, a local-cache name or a ``.gguf`` file) loads from, checked, not loaded."""
    return gguf_folder(model) if str(model).endswith(".gguf") else resolve_model_dir(model, allow_pickle=allow_pickle)


def convert_gguf(path: str | Path, *, trust_remote_code: bool = False) -> Path:
    """Dequantise a GGUF file into a cached HF folder (safetensors) once; return that folder."""
    out = gguf_folder(path)
    path = Path(path).expanduser()
    if (out / "config.json").exists() and _has_safetensors(out):
        return out
    kw: dict[str, Any] = dict(gguf_file=path.name, local_files_only=True, trust_remote_code=trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
        tok = AutoTokenizer.from_pretrained(path.parent, **kw)
    except (ValueError, KeyError, RuntimeError) as e:
        raise ModelLoadError(f"cannot convert GGUF {path}: {e}") from e
    except (struct.error, OSError, EOFError, IndexError, TypeError, UnicodeDecodeError) as e:  # a damaged or fake file
        raise ModelLoadError(f"cannot convert GGUF {path}: the file is damaged or not a GGUF model "
                             f"({'struct.error' if isinstance(e, struct.error) else type(e).__name__}; {e}); copy it again or pass a model folder") from e
    # The weights are already dequantised to fp32; transformers still marks a GGUF-loaded model as
    # quantized and refuses to serialise it, so drop the marker before saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # the cache folder is ours: an incomplete one (a killed conversion) is replaced whole
    with OutputRoot(gguf_cache_dir()).folder(out.name, is_previous=lambda folder: True, what="GGUF conversion") as stage:
        model.save_pretrained(stage, safe_serialization=True)
        tok.save_pretrained(stage)
    return out


def _check_architecture(cfg: PretrainedConfig, d: Path, trust_remote_code: bool) -> None:
    archs = ", ".join(cfg.architectures or []) or "no architectures"
    if trust_remote_code and getattr(cfg, "auto_map", None):
        return  # remote code: checked when the probe attention is installed
    if cfg.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"unsupported architecture in {d}: model_type={cfg.model_type!r} ({archs}) "
            "is not a causal language model known to transformers"
        )
    cls = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type], None)
    if not getattr(cls, "_supports_attention_backend", False):
        raise ModelLoadError(
            f"unsupported architecture {cfg.model_type!r} in {d}: its attention does not go through transformers' "
            "attention interface, so the probe attention cannot be installed (Qwen3, Qwen2, Llama and similar work)"
        )


def check_device(device: str) -> None:
    """Fail before loading anything when ``device`` does not exist on this machine."""
    try:
        dev = torch.device(device)
    except RuntimeError as error:
        raise ModelLoadError(f"--device {device!r} is not a torch device ({error}); use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise ModelLoadError(f"--device {device}: torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s) here; "
                             "use --device cpu, or install a CUDA build of torch on a GPU machine")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ModelLoadError(f"--device {device}: MPS is not available on this machine; use --device cpu")


def load_model(
    model: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    device_map: str | dict[str, Any] | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
) -> tuple[PreTrainedModel, Any]:
    """Load ``(model, tokenizer)`` from local files only.

    ``model``: a model directory, a name in the local HF cache, or a ``.gguf`` file.
    ``dtype``: float32 | bfloat16 | float16 | auto. ``device_map="auto"`` spreads the model over
    the available GPUs (then ``device`` is ignored). ``EngineSession`` passes
    ``attn_implementation="basm_probe"``.
    """
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if device_map is None:
        check_device(device)
    if str(model).endswith(".gguf"):
        d = convert_gguf(model, trust_remote_code=trust_remote_code)
    else:
        d = resolve_model_dir(model, allow_pickle=allow_pickle)
    try:
        cfg = AutoConfig.from_pretrained(d, local_files_only=True, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as e:
        raise ModelLoadError(f"unsupported architecture in {d}: {e}") from e
    _check_architecture(cfg, d, trust_remote_code)
    if not any((d / f).exists() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{d} has weights but no tokenizer files ({', '.join(TOKENIZER_FILES)})")
    try:
        m = AutoModelForCausalLM.from_pretrained(
            d,
            dtype=DTYPES[dtype],
            device_map=device_map,
            attn_implementation=attn_implementation,
            local_files_only=True,
            trust_remote_code=trust_remote_code,
            use_safetensors=_has_safetensors(d) or not allow_pickle,
        )
    except SafetensorError as e:  # truncated or corrupt file: name it (the library does not)
        files = ", ".join(p.name for p in sorted(d.glob("*.safetensors")))
        raise ModelLoadError(f"cannot read the safetensors weights in {d} ({files}): {e}; the file is truncated or corrupt, copy it again") from e
    except (pickle.UnpicklingError, EOFError) as e:  # --allow-pickle with a damaged or non-weights pickle
        files = ", ".join(_pickle_files(d))
        raise ModelLoadError(f"cannot read the pickle weights in {d} ({files}): {type(e).__name__}; the file is truncated, corrupt or holds objects other than tensors (torch.load weights_only "
                             "refused them; nothing was executed)") from e
    if device_map is None:
        m = m.to(device)
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True, trust_remote_code=trust_remote_code)
    return m.eval(), tok


def check_context_length(n_tokens: int, model: PreTrainedModel | PretrainedConfig) -> None:
    """Raise :class:`PromptTooLongError` if ``n_tokens`` exceeds the model's context window."""
    cfg = model.config if isinstance(model, PreTrainedModel) else model
    limit = getattr(cfg.get_text_config(), "max_position_embeddings", None)
    if limit is not None and n_tokens > limit:
        raise PromptTooLongError(
            f"prompt has {n_tokens} tokens but the model's context is {limit} (max_position_embeddings); "
            "shorten the memory block or lower k"
        )

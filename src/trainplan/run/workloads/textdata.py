"""Training sequences from the user's data file, for a pretrained checkpoint (``trainplan run``).

read (JSONL / Parquet / text) → format (text, instruction, chat) → tokenize with the
checkpoint's tokenizer → pack or pad to ``seq_len`` → cache in the run directory →
sample rows, a pure function of ``(seed, step, micro-batch, rank)``.

Loss masks: the labels of prompt tokens (instruction records) and of every
non-assistant part of a chat are ``-100``, the index Hugging Face causal LMs and
``torch.nn.functional.cross_entropy`` ignore.  Padding is on the right; the
model is causal, so real tokens never attend to the padding after them and no
attention mask is needed (pad labels are ``-100``).

The parent process tokenizes once (with a progress callback) before the workers
start; the workers read ``DIR/data/*.safetensors``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from trainplan.errors import SpecError
from trainplan.files import update_digest
from trainplan.run.workloads.common import batch_generator
from trainplan.spec import DataFormat, DataStyle

IGNORE = -100  # the label index HF causal LMs leave out of the loss
CACHE_VERSION = 1
TEXT_CHUNK_CHARS = 1 << 20  # a plain-text file is tokenized in chunks of about 1 MiB, cut at line ends
TOKENIZE_BATCH = 512  # records per call to the (Rust, parallel) fast tokenizer
#: The instruction prompt: the Alpaca layout (Taori et al. 2023, Stanford Alpaca), in our own words.
INSTRUCTION_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
INSTRUCTION_PROMPT_WITH_INPUT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")  # fmt: skip

#: Structured formats trainplan does not parse: refused rather than read as plain text.
STRUCTURED_NOT_READ = (".json", ".csv", ".tsv", ".arrow", ".xlsx")

Progress = Callable[[int, int], None]  # (records done, records in all)


@dataclass(frozen=True)
class DataStats:
    """What tokenizing gave; written to ``DIR/data/data.json`` and shown in the run's notes."""

    style: str
    packing: bool
    examples: int  # records read (training split)
    rows: int  # training sequences of seq_len tokens
    tokens: int  # tokens in the training rows, padding excluded
    loss_tokens: int  # of which carry a loss
    truncated: int  # examples cut at seq_len (padding mode)
    dropped: int  # examples (or packed rows) without a single token to learn from
    eval_examples: int
    eval_rows: int
    seconds: float

    def describe(self) -> str:
        how = "packed" if self.packing else "padded"
        text = (f"data: {self.examples:,} {self.style} examples → {self.rows:,} {how} rows, {self.tokens:,} tokens "
                f"({self.loss_tokens:,} with loss), tokenized in {self.seconds:.2f} s")
        if self.truncated:
            text += f"; {self.truncated:,} truncated at seq_len"
        if self.dropped:
            text += f"; {self.dropped:,} dropped (nothing to learn within seq_len)"
        if self.eval_rows:
            text += f"; eval {self.eval_examples:,} examples → {self.eval_rows:,} rows"
        return text


@dataclass(frozen=True)
class TokenRows:
    """Sequences of ``seq_len`` token ids and their labels (``IGNORE`` where there is no loss)."""

    input_ids: torch.Tensor  # int32 [rows, seq_len]
    labels: torch.Tensor  # int32 [rows, seq_len]

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class PreparedData:
    train: TokenRows
    eval: TokenRows | None
    stats: DataStats
    key: str


# --------------------------------------------------------------------------- reading


def _field_error(path: Path, message: str) -> SpecError:
    return SpecError(f"{path}: {message}", field="data")


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _field_error(path, f"cannot be read ({exc.strerror or exc})") from None
    if b"\x00" in raw[:8192]:
        raise _field_error(path, "is a binary file; data is a JSONL, Parquet (.parquet) or UTF-8 text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _field_error(path, f"is not UTF-8 text (byte {exc.start})") from None


def read_records(path: Path) -> list[Any]:
    """The records of a data file: dicts from JSONL (``.jsonl``) or Parquet (``.parquet``), text chunks otherwise."""
    if not path.is_file():
        raise SpecError(f"data file not found: {path}", field="data")
    suffix = path.suffix.lower()
    if suffix in STRUCTURED_NOT_READ:  # records trainplan does not parse would be trained on as raw text
        raise _field_error(path, f"{suffix} files are not read; data is JSONL (.jsonl, one JSON object per line), "
                                 "Parquet (.parquet) or plain text (.txt and other suffixes)")
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SpecError("reading Parquet needs pyarrow: pip install 'trainplan[tabular]'", field="data") from None
        try:
            records: list[Any] = pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a damaged file
            raise _field_error(path, f"is not a readable Parquet file ({str(exc).splitlines()[0][:200]})") from None
    elif suffix == ".jsonl":
        records = []
        for number, line in enumerate(_read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise _field_error(path, f"line {number} is not JSON (JSONL: one JSON object per line)") from None
            if not isinstance(record, dict):
                raise _field_error(path, f"line {number} is a JSON {type(record).__name__}, not an object")
            records.append(record)
    else:
        text = _read_text(path)
        records = list(_text_chunks(text))
    if not records or (isinstance(records[0], str) and not any(r.strip() for r in records)):
        raise _field_error(path, "is empty")
    return records


def _text_chunks(text: str) -> Iterator[str]:
    start = 0
    while start < len(text):
        end = min(len(text), start + TEXT_CHUNK_CHARS)
        if end < len(text):
            cut = text.rfind("\n", start, end)
            end = cut + 1 if cut > start else end
        yield text[start:end]
        start = end


def detect_style(records: list[Any], fmt: DataFormat, path: Path) -> DataStyle:
    """The style of ``records``: as the job says, else from the first record's fields."""
    if isinstance(records[0], str):
        if fmt.style not in (DataStyle.AUTO, DataStyle.TEXT):
            raise SpecError(f"{path} is plain text; style {fmt.style.value} needs JSONL or Parquet records",
                            field="data_format.style")
        return DataStyle.TEXT
    if fmt.style is not DataStyle.AUTO:
        return fmt.style
    keys = set(records[0])
    if fmt.messages_field in keys:
        return DataStyle.CHAT
    if fmt.instruction_field in keys and fmt.response_field in keys:
        return DataStyle.INSTRUCTION
    if fmt.text_field in keys:
        return DataStyle.TEXT
    raise _field_error(path, f"the first record has fields {', '.join(sorted(keys)) or '(none)'}; expected "
                             f"{fmt.text_field!r} (text), {fmt.instruction_field!r} + {fmt.response_field!r} "
                             f"(instruction) or {fmt.messages_field!r} (chat) — set data_format fields to name yours")


def _get(record: dict[str, Any], field: str, index: int, path: Path, *, kind: type = str, optional: bool = False) -> Any:
    value = record.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, kind):
        got = "missing" if field not in record else f"a {type(value).__name__}"
        raise _field_error(path, f"record {index + 1}: field {field!r} is {got}; expected a "
                                 f"{'string' if kind is str else 'list'}")
    return value


# --------------------------------------------------------------------------- formatting


def instruction_prompt(instruction: str, context: str | None) -> str:
    if context:
        return INSTRUCTION_PROMPT_WITH_INPUT.format(instruction=instruction, input=context)
    return INSTRUCTION_PROMPT.format(instruction=instruction)


def chat_segments(tokenizer: Any, messages: list[dict[str, Any]], index: int, path: Path) -> list[tuple[str, bool]]:
    """The rendered conversation cut into (text, has loss) pieces: the text of each assistant turn has a loss.

    Each assistant turn is found by rendering the conversation up to it with the
    generation prompt and then with the turn; the first must be a prefix of the
    second (true of the templates transformers ships; checked, one line if not).
    """
    segments: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            raise _field_error(path, f"record {index + 1}: message {i + 1} needs string 'role' and 'content'")
        if message["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True) if i else ""
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not before.startswith(done) or not upto.startswith(before):
            raise _field_error(path, f"record {index + 1}: the tokenizer's chat template does not render the "
                                     "conversation up to an assistant turn as a prefix of the whole; use style: text")
        segments += [(before[len(done):], False), (upto[len(before):], True)]
        done = upto
    rest = tokenizer.apply_chat_template(messages, tokenize=False)
    if rest.startswith(done) and len(rest) > len(done):
        segments.append((rest[len(done):], False))
    if not any(has_loss for _, has_loss in segments):
        raise _field_error(path, f"record {index + 1}: no assistant message to learn from")
    return segments


def _examples(records: list[Any], style: DataStyle, fmt: DataFormat, tokenizer: Any, path: Path,
              progress: Progress | None) -> Iterator[tuple[list[int], list[int]]]:
    """(token ids, labels) per example."""
    eos = tokenizer.eos_token_id
    total = len(records)
    for start in range(0, total, TOKENIZE_BATCH):
        batch = records[start : start + TOKENIZE_BATCH]
        if style is DataStyle.TEXT:
            if isinstance(batch[0], str):  # chunks of one text file: one document, EOS at its very end
                encoded = tokenizer(batch, add_special_tokens=False)["input_ids"]
                for j, ids in enumerate(encoded):
                    if start + j == 0 and tokenizer.bos_token_id is not None:
                        ids = [tokenizer.bos_token_id, *ids]
                    if start + j == total - 1 and eos is not None:
                        ids = [*ids, eos]
                    yield ids, ids
            else:
                texts = [_get(r, fmt.text_field, start + j, path) for j, r in enumerate(batch)]
                for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]:
                    ids = ids + ([eos] if eos is not None else [])
                    yield ids, ids
        elif style is DataStyle.INSTRUCTION:
            prompts, responses = [], []
            for j, r in enumerate(batch):
                context = _get(r, fmt.input_field, start + j, path, optional=True)
                prompts.append(instruction_prompt(_get(r, fmt.instruction_field, start + j, path), context))
                responses.append(_get(r, fmt.response_field, start + j, path))
            p_ids = tokenizer(prompts, add_special_tokens=True)["input_ids"]
            r_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
            for p, r in zip(p_ids, r_ids):
                r = r + ([eos] if eos is not None else [])
                yield p + r, [IGNORE] * len(p) + r
        else:
            if not getattr(tokenizer, "chat_template", None):
                raise SpecError(f"the checkpoint's tokenizer has no chat template; chat data ({path}) needs one "
                                "(tokenizer_config.json 'chat_template' or chat_template.jinja)", field="data_format.style")
            for j, r in enumerate(batch):
                messages = _get(r, fmt.messages_field, start + j, path, kind=list)
                ids: list[int] = []
                labels: list[int] = []
                for text, has_loss in chat_segments(tokenizer, messages, start + j, path):
                    piece = tokenizer(text, add_special_tokens=False)["input_ids"]
                    ids += piece
                    labels += piece if has_loss else [IGNORE] * len(piece)
                yield ids, labels
        if progress is not None:
            progress(min(start + TOKENIZE_BATCH, total), total)


def _has_loss(labels: torch.Tensor) -> torch.Tensor:
    """Rows with at least one target: HF shifts labels left by one, so position 0 is never a target."""
    return (labels[:, 1:] != IGNORE).any(dim=1)


def to_rows(examples: Iterator[tuple[list[int], list[int]]], seq_len: int, *, packing: bool, pad_id: int
            ) -> tuple[TokenRows, int, int, int]:
    """Pack (concatenate, cut into rows) or pad (one example per row) → rows, examples, truncated, dropped."""
    count = truncated = 0
    if packing:
        ids_all: list[int] = []
        labels_all: list[int] = []
        for ids, labels in examples:
            ids_all += ids
            labels_all += labels
            count += 1
        n = len(ids_all) // seq_len
        input_ids = torch.tensor(ids_all[: n * seq_len], dtype=torch.int32).view(n, seq_len)
        labels_t = torch.tensor(labels_all[: n * seq_len], dtype=torch.int32).view(n, seq_len)
    else:
        rows_ids: list[list[int]] = []
        rows_labels: list[list[int]] = []
        for ids, labels in examples:
            count += 1
            if len(ids) > seq_len:
                truncated += 1
                ids, labels = ids[:seq_len], labels[:seq_len]
            pad = seq_len - len(ids)
            rows_ids.append(ids + [pad_id] * pad)
            rows_labels.append(labels + [IGNORE] * pad)
        input_ids = torch.tensor(rows_ids, dtype=torch.int32).view(-1, seq_len)
        labels_t = torch.tensor(rows_labels, dtype=torch.int32).view(-1, seq_len)
    keep = _has_loss(labels_t) if labels_t.numel() else torch.zeros(0, dtype=torch.bool)
    dropped = int((~keep).sum())
    return TokenRows(input_ids[keep].contiguous(), labels_t[keep].contiguous()), count, truncated, dropped


# --------------------------------------------------------------------------- the whole preparation


def load_tokenizer(checkpoint: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint))
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a broken tokenizer
        raise SpecError(f"cannot load the tokenizer in {checkpoint}: {str(exc).splitlines()[0][:200]}",
                        field="model") from None


def cache_key(checkpoint: Path, data: Path, fmt: DataFormat, seq_len: int, seed: int) -> str:
    """SHA-256 of everything the token rows depend on: data files, tokenizer files, format, seq_len, seed."""
    digest = hashlib.sha256(f"v{CACHE_VERSION}\n{fmt.model_dump_json()}\n{seq_len}\n{seed}\n".encode())
    for path in (data, Path(fmt.eval_data).expanduser() if fmt.eval_data else None):
        if path is not None:
            digest.update(str(path.stat().st_size).encode())
            update_digest(digest, path)
    for name in TOKENIZER_FILES:
        if (checkpoint / name).is_file():
            digest.update(name.encode())
            update_digest(digest, checkpoint / name)
    return digest.hexdigest()


def prepare(checkpoint: Path, data: Path, fmt: DataFormat | None, seq_len: int, seed: int,
            progress: Progress | None = None) -> PreparedData:
    """Read, format, tokenize and pack / pad the job's data; raises :class:`SpecError` on bad input."""
    fmt = fmt or DataFormat()
    started = time.perf_counter()
    records = read_records(data)
    style = detect_style(records, fmt, data)
    tokenizer = load_tokenizer(checkpoint)
    packing = fmt.packing if fmt.packing is not None else style is DataStyle.TEXT
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    eval_records: list[Any] = []
    if fmt.eval_data:
        eval_path = Path(fmt.eval_data).expanduser()
        eval_records = read_records(eval_path)
        if detect_style(eval_records, fmt.model_copy(update={"style": style}), eval_path) is not style:
            raise SpecError(f"{eval_path} is not in the style of {data} ({style.value})", field="data_format.eval_data")
    elif fmt.eval_fraction > 0:
        if isinstance(records[0], str):
            raise SpecError("eval_fraction needs JSONL or Parquet records; give eval_data for a text file",
                            field="data_format.eval_fraction")
        order = torch.randperm(len(records), generator=batch_generator(seed, -2)).tolist()
        n_eval = max(1, math.ceil(fmt.eval_fraction * len(records)))
        if n_eval >= len(records):
            raise SpecError(f"eval_fraction {fmt.eval_fraction} leaves no training example of {len(records)}",
                            field="data_format.eval_fraction")
        held = set(order[-n_eval:])
        eval_records = [r for i, r in enumerate(records) if i in held]
        records = [r for i, r in enumerate(records) if i not in held]
    total = len(records) + len(eval_records)

    def train_progress(done: int, _: int) -> None:
        if progress is not None:
            progress(done, total)

    def eval_progress(done: int, _: int) -> None:
        if progress is not None:
            progress(len(records) + done, total)

    train, examples, truncated, dropped = to_rows(_examples(records, style, fmt, tokenizer, data, train_progress),
                                                  seq_len, packing=packing, pad_id=pad_id)
    if train.rows == 0:
        raise SpecError(f"{data} gives no training row of seq_len {seq_len} tokens with a loss "
                        f"({examples} examples; pack them with data_format.packing: true or lower seq_len)", field="data")
    evaluation = None
    eval_examples = 0
    if eval_records:
        evaluation, eval_examples, _, _ = to_rows(_examples(eval_records, style, fmt, tokenizer, data, eval_progress),
                                                  seq_len, packing=packing, pad_id=pad_id)
        if evaluation.rows == 0:
            raise SpecError(f"the eval split gives no row of seq_len {seq_len} tokens with a loss", field="data_format")
    real = train.labels != IGNORE
    stats = DataStats(
        style=style.value,
        packing=packing,
        examples=examples,
        rows=train.rows,
        tokens=int((train.input_ids != pad_id).sum()) if not packing else train.input_ids.numel(),
        loss_tokens=int(real[:, 1:].sum()),
        truncated=truncated,
        dropped=dropped,
        eval_examples=eval_examples,
        eval_rows=evaluation.rows if evaluation is not None else 0,
        seconds=time.perf_counter() - started,
    )
    return PreparedData(train, evaluation, stats, cache_key(checkpoint, data, fmt, seq_len, seed))


# --------------------------------------------------------------------------- the cache in the run directory


def cache_dir(out_dir: Path) -> Path:
    return out_dir / "data"


def write_cache(out_dir: Path, prepared: PreparedData) -> None:
    """``DIR/data/{train,eval}.safetensors`` and ``data.json`` (key and statistics), each written atomically."""
    from safetensors.torch import save_file

    from trainplan.files import write_json_atomic

    folder = cache_dir(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    splits = {"train": prepared.train, "eval": prepared.eval}
    for name, rows in splits.items():
        target = folder / f"{name}.safetensors"
        if rows is None:
            target.unlink(missing_ok=True)
            continue
        tmp = folder / f".{name}.safetensors.tmp"
        save_file({"input_ids": rows.input_ids, "labels": rows.labels}, str(tmp))
        tmp.replace(target)
    write_json_atomic(folder / "data.json", {"key": prepared.key, "stats": asdict(prepared.stats)})


def cached_key(out_dir: Path) -> str | None:
    """The key of the cache in ``out_dir`` (None when there is none)."""
    try:
        return json.loads((cache_dir(out_dir) / "data.json").read_text(encoding="utf-8"))["key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_cache(out_dir: Path) -> tuple[TokenRows, TokenRows | None]:
    """The cached train and eval rows."""
    from safetensors.torch import load_file

    folder = cache_dir(out_dir)
    train = load_file(str(folder / "train.safetensors"))
    evaluation = None
    if (folder / "eval.safetensors").is_file():
        e = load_file(str(folder / "eval.safetensors"))
        evaluation = TokenRows(e["input_ids"], e["labels"])
    return TokenRows(train["input_ids"], train["labels"]), evaluation


# --------------------------------------------------------------------------- sampling


class RowSampler:
    """Rows of each micro-batch: epoch after epoch, each epoch a seeded permutation of the rows.

    The global position of row ``j`` of micro-batch ``micro`` of step ``step`` on
    ``rank`` is ``((step · accum + micro) · world + rank) · micro_batch + j``; its
    epoch and index follow from it, so the rows are a pure function of the
    arguments — a resumed run replays the same data.
    """

    def __init__(self, rows: TokenRows, *, seed: int, world_size: int, micro_batch: int, grad_accum: int) -> None:
        self.data, self.seed = rows, seed
        self.world, self.micro_batch, self.accum = world_size, micro_batch, grad_accum

    @lru_cache(maxsize=4)  # noqa: B019 - a few epochs' permutations per sampler
    def _order(self, epoch: int) -> torch.Tensor:
        return torch.randperm(self.data.rows, generator=batch_generator(self.seed, -1, epoch))

    def indices(self, step: int, micro: int, rank: int) -> list[int]:
        first = ((step * self.accum + micro) * self.world + rank) * self.micro_batch
        out = []
        for g in range(first, first + self.micro_batch):
            epoch, pos = divmod(g, self.data.rows)
            out.append(int(self._order(epoch)[pos]))
        return out

    def batch(self, step: int, micro: int, rank: int) -> dict[str, torch.Tensor]:
        idx = torch.tensor(self.indices(step, micro, rank))
        return {"input_ids": self.data.input_ids[idx].long(), "labels": self.data.labels[idx].long()}

    def epochs(self, steps: int) -> float:
        """Epochs that ``steps`` optimizer steps cover."""
        return steps * self.accum * self.world * self.micro_batch / self.data.rows

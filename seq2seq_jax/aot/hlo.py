"""HBM traffic read off a compiled TPU program: the bytes that cross the chip's memory bus.

The compiler's ``bytes accessed`` counts every operand of every operation wherever it
lives. On a TPU the compiler prefetches weights from HBM into the core's vector
memory (``copy-start`` / ``slice-start`` into memory space ``S(1)``) and the
operations then read them there; ``bytes accessed`` counts such a weight several
times (six FFN layers of 32 rows with 50 MB of float32 weights: 202 MB "accessed"),
which overstates the time of a step whose cost is reading weights once. Here every
top-level operation of the compiled HLO counts only its operands and results that
live in HBM (no memory-space annotation, or ``S(0)``); a prefetch counts the HBM
bytes it reads; a loop's body counts as many times as its known trip count. An
operand read only through slices or gathers (one layer of a stacked cache, the rows of
an embedding table) counts what they take; an update made in place (a
``dynamic-update-slice`` whose buffer is its result) counts the update, not the buffer.
A lower bound on HBM traffic under the compiler's own placement; an operation that
re-reads an HBM operand (tiling) counts it once.
"""

from __future__ import annotations

import dataclasses
import math
import re

_ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                  "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
                  "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e4m3fn|f8e5m2)\[([0-9,]*)\](\{[^}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# Operations that move no data of their own.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "copy-done", "slice-done", "all-gather-done",
         "all-reduce-done", "collective-permute-done", "send-done", "recv-done", "iota",
         "opt-barrier", "add-dependency"}
# Operations that read only part of their first operand.
_SLICING = {"slice", "dynamic-slice", "gather"}


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of an HLO type: its bytes and whether it lives in HBM."""

  bytes: int
  in_hbm: bool


def arrays(type_text: str) -> list[Array]:
  """The arrays of an HLO type (a shape or a tuple of shapes), with their memory spaces."""
  out = []
  for element, dims, layout in _ARRAY.findall(type_text):
    count = math.prod(int(d) for d in dims.split(",") if d)
    space = _MEMORY_SPACE.search(layout or "")
    out.append(Array(count * _ELEMENT_BYTES.get(element, 4),
                     space is None or space.group(1) == "0"))
  return out


@dataclasses.dataclass
class _Instruction:
  name: str
  type_text: str
  op: str
  operands: list[str]
  attributes: str
  attributes_and_operands: str = ""


def _split_type(rest: str) -> tuple[str, str]:
  """``"TYPE op(...), attrs"`` -> (TYPE, the remainder from the op on)."""
  if rest.startswith("("):
    depth = 0
    for i, char in enumerate(rest):
      depth += char == "("
      depth -= char == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(" ")
  return head, tail


def _parse(line: str) -> _Instruction | None:
  match = re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$", line)
  if not match:
    return None
  name, rest = match.groups()
  type_text, rest = _split_type(rest)
  op_match = re.match(r"([\w\-]+)\(", rest)
  if not op_match:
    return None
  depth, end = 0, len(rest)
  for i in range(op_match.end() - 1, len(rest)):
    depth += rest[i] == "("
    depth -= rest[i] == ")"
    if depth == 0:
      end = i
      break
  operands = re.findall(r"%([\w.\-]+)", rest[op_match.end():end])
  return _Instruction(name, type_text, op_match.group(1), operands, rest[end + 1:],
                      rest[op_match.end() - 1:])


def computations(text: str) -> tuple[dict[str, list[str]], str | None]:
  """The HLO module's computations (name -> instruction lines) and the entry's name."""
  found: dict[str, list[str]] = {}
  entry, current = None, None
  for line in text.splitlines():
    header = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\([^{]*)?\{\s*$", line)
    if header and not line.startswith(" "):
      current = header.group(2)
      found[current] = []
      if header.group(1):
        entry = current
      continue
    if current is not None and line.startswith(" "):
      found[current].append(line)
  return found, entry


@dataclasses.dataclass
class Traffic:
  """HBM bytes of a compiled program; ``unknown_trips`` counts loops of unknown length,
  each counted once."""

  hbm_bytes: float
  unknown_trips: int
  by_instruction: dict[str, float] = dataclasses.field(default_factory=dict)

  def largest(self, count: int = 10) -> list[tuple[str, float]]:
    """The ``count`` instructions that move the most HBM bytes (loops' trips included)."""
    return sorted(self.by_instruction.items(), key=lambda item: -item[1])[:count]


def hbm_traffic(text: str) -> Traffic:
  """The HBM traffic of a compiled program's text (``compiled.as_text()``)."""
  found, entry = computations(text)
  if entry is None:
    return Traffic(0.0, 0)
  unknown = 0
  by_instruction: dict[str, float] = {}

  def fusion_bytes(instruction: _Instruction, types: dict[str, str]) -> float:
    """HBM bytes of a fusion: an operand read only through slices or gathers inside it
    counts the slices; a buffer that a dynamic-update-slice inside it updates in place
    counts the update, read and written, instead of the buffer."""
    called = re.search(r"calls=%([\w.\-]+)", instruction.attributes)
    body = [i for i in map(_parse, found.get(called.group(1), []) if called else []) if i]
    parameters = {int(m.group(1)): i.name for i in body if i.op == "parameter"
                  for m in [re.match(r"\((\d+)\)", i.attributes_and_operands)] if m}
    inner_types = {i.name: i.type_text for i in body}
    users: dict[str, list[_Instruction]] = {}
    for inner in body:
      for operand in inner.operands:
        users.setdefault(operand, []).append(inner)
    updated = {inner.operands[0]: inner for inner in body
               if inner.op == "dynamic-update-slice" and len(inner.operands) > 1}
    results = [a.bytes for a in arrays(instruction.type_text) if a.in_hbm]
    total = 0.0
    for index, operand in enumerate(instruction.operands):
      operand_arrays = [a for a in arrays(types.get(operand, "")) if a.in_hbm]
      if not operand_arrays:
        continue
      size = sum(a.bytes for a in operand_arrays)
      inner_name = parameters.get(index)
      inner_users = users.get(inner_name, []) if inner_name else []
      if inner_name in updated and size in results:
        results.remove(size)  # written in place: the update only
        update = updated[inner_name].operands[1]
        total += 2 * sum(a.bytes for a in arrays(inner_types.get(update, "")))
      elif inner_users and all(u.op in _SLICING for u in inner_users):
        total += sum(a.bytes for u in inner_users for a in arrays(u.type_text))
      else:
        total += size
    return total + sum(results)

  def walk(name: str, trips: float) -> float:
    nonlocal unknown
    types: dict[str, str] = {}
    total = 0.0
    for line in found.get(name, []):
      instruction = _parse(line)
      if instruction is None:
        continue
      types[instruction.name] = instruction.type_text
      op = instruction.op
      if op in _FREE:
        continue
      if op == "while":
        body = re.search(r"body=%?([\w.\-]+)", instruction.attributes)
        count = re.search(r'"known_trip_count":\{"n":"(\d+)"', instruction.attributes)
        if count is None:
          unknown += 1
        total += walk(body.group(1), trips * (int(count.group(1)) if count else 1)) if body else 0
        continue
      if op in ("call", "conditional", "async-start"):
        for called in re.findall(r"(?:to_apply|calls|branch_computations=\{)=?%?([\w.\-]+)",
                                 instruction.attributes):
          total += walk(called, trips)
        continue
      operand_arrays = [a for operand in instruction.operands
                        for a in arrays(types.get(operand, ""))]
      result_arrays = arrays(instruction.type_text)
      if op in ("copy-start", "slice-start"):
        # Reads its source in HBM once (a slice: only the slice), or writes one there.
        destination = result_arrays[-2] if len(result_arrays) >= 2 else None
        source_in_hbm = any(a.in_hbm for a in operand_arrays)
        if destination is not None and (source_in_hbm or destination.in_hbm):
          total += trips * destination.bytes
          by_instruction[instruction.name] = trips * destination.bytes
        continue
      if op == "custom-call" and "ConcatBitcast" in instruction.attributes:
        continue
      written = sum(a.bytes for a in result_arrays if a.in_hbm)
      if op == "fusion":
        moved = fusion_bytes(instruction, types)
      elif op in _SLICING:  # reads only what it takes
        moved = written + (sum(a.bytes for a in result_arrays)
                           if any(a.in_hbm for a in operand_arrays[:1]) else 0)
      elif op == "dynamic-update-slice" and written and operand_arrays[0].in_hbm:
        moved = 2 * operand_arrays[1].bytes if len(operand_arrays) > 1 else 0
      else:
        moved = sum(a.bytes for a in operand_arrays if a.in_hbm) + written
      total += trips * moved
      by_instruction[instruction.name] = trips * moved
    return total

  return Traffic(walk(entry, 1.0), unknown, by_instruction)

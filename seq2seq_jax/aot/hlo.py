"""HBM traffic read off a compiled TPU program: the bytes that cross the chip's memory bus.

The compiler's ``bytes accessed`` counts every operand of every operation wherever it
lives. On a TPU the compiler prefetches weights from HBM into the core's vector
memory (``copy-start`` / ``slice-start`` into memory space ``S(1)``) and the
operations then read them there; ``bytes accessed`` counts such a weight several
times (six FFN layers of 32 rows with 50 MB of float32 weights: 202 MB "accessed"),
which overstates the time of a step whose cost is reading weights once. Here every
top-level operation of the compiled HLO counts only its operands and results that
live in HBM (no memory-space annotation, or ``S(0)``); a prefetch counts the HBM
bytes it reads; a loop's body counts as many times as its trip count (``loop_trips``). An
operand read only through slices or gathers (one layer of a stacked cache, the rows of
an embedding table) counts what they take; an update made in place (a
``dynamic-update-slice`` whose buffer is its result) counts the update, not the buffer.
A lower bound on HBM traffic under the compiler's own placement; an operation that
re-reads an HBM operand (tiling) counts it once.

Loops. XLA's cost analysis (``compiled.cost_analysis()``) counts a while loop's body
once, and the TPU compiler (libtpu 0.0.42.1) writes no ``known_trip_count`` into the
compiled program. ``loop_trips`` reads each loop's trip count off the compiled
program itself: the counter's start (a constant in the tuple the loop starts from),
its step (the body adds a constant to it) and its limit (the condition compares it
with a constant), as ``lax.scan`` and ``lax.fori_loop`` with static bounds compile.
A condition that also stops on data (``counter < limit and not done``, a search)
gives only an upper bound (``how="at most"``); a limit computed at run time gives
none. ``loop_costs`` then adds to the compiler's totals what its single count of each
body leaves out: the body's FLOPs and bytes times (trips - 1), counted here from the
HLO (``instruction_flops``: 2 M K N a matrix product, one a result element of an
arithmetic operation, one an input element of a reduction; transcendental functions
and data movement none, as XLA's own cost analysis does).
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
# Operations XLA's cost analysis counts as one FLOP a result element (transcendental
# functions count apart, as "transcendentals", and data movement counts none).
_ARITHMETIC = {"add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
               "compare", "select", "and", "or", "xor", "not", "negate", "abs", "sign", "clamp",
               "shift-left", "shift-right-logical", "shift-right-arithmetic", "convert", "floor",
               "ceil", "round-nearest-afz", "round-nearest-even", "is-finite", "popcnt",
               "count-leading-zeros"}
# What a loop counter passes through unchanged.
_SAME_VALUE = {"copy", "bitcast", "convert"}


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of an HLO type: its bytes and whether it lives in HBM."""

  bytes: int
  in_hbm: bool


def dims(type_text: str) -> list[int]:
  """The dimensions of the first array of an HLO type (``[]`` for a scalar)."""
  match = _ARRAY.search(type_text)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


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
  """HBM bytes of a compiled program; ``unknown_trips`` counts loops whose trips
  ``loop_trips`` cannot read exactly (data-dependent ones too), each counted once."""

  hbm_bytes: float
  unknown_trips: int
  by_instruction: dict[str, float] = dataclasses.field(default_factory=dict)
  in_loops: float = 0.0  # of hbm_bytes, what loop bodies move (all their trips)
  in_loops_once: float = 0.0  # what loop bodies move counted once each, as XLA counts them

  def largest(self, count: int = 10) -> list[tuple[str, float]]:
    """The ``count`` instructions that move the most HBM bytes (loops' trips included)."""
    return sorted(self.by_instruction.items(), key=lambda item: -item[1])[:count]


def hbm_traffic(text: str, *, every_memory: bool = False,
                loops: list[Loop] | None = None) -> Traffic:
  """The HBM traffic of a compiled program's text (``compiled.as_text()``).

  ``every_memory=True`` counts the arrays in every memory space (vector memory
  too), as XLA's "bytes accessed" does, by the same rules for slices and in-place
  updates: what ``loop_costs`` multiplies by a loop's trips. ``loops``: the
  program's ``loop_trips``, where the caller has them already.
  """
  kept = lambda array: every_memory or array.in_hbm
  found, entry = computations(text)
  if entry is None:
    return Traffic(0.0, 0)
  trips_of = _exact_trips(loop_trips(text) if loops is None else loops)
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
    results = [a.bytes for a in arrays(instruction.type_text) if kept(a)]
    total = 0.0
    for index, operand in enumerate(instruction.operands):
      operand_arrays = [a for a in arrays(types.get(operand, "")) if kept(a)]
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

  looped, looped_once = 0.0, 0.0

  def walk(name: str, trips: float, inside: bool = False) -> float:
    nonlocal unknown, looped, looped_once
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
        count = trips_of.get(instruction.name)
        if count is None:
          unknown += 1
        moved = walk(body.group(1), trips * (count if count is not None else 1), True) if body else 0
        looped += 0 if inside else moved
        total += moved
        continue
      if op in ("call", "conditional", "async-start"):
        for called in re.findall(r"(?:to_apply|calls|branch_computations=\{)=?%?([\w.\-]+)",
                                 instruction.attributes):
          total += walk(called, trips, inside)
        continue
      operand_arrays = [a for operand in instruction.operands
                        for a in arrays(types.get(operand, ""))]
      result_arrays = arrays(instruction.type_text)
      if op in ("copy-start", "slice-start"):
        # Reads its source in HBM once (a slice: only the slice), or writes one there.
        destination = result_arrays[-2] if len(result_arrays) >= 2 else None
        source_in_hbm = any(kept(a) for a in operand_arrays)
        if destination is not None and (source_in_hbm or kept(destination)):
          total += trips * destination.bytes
          looped_once += destination.bytes if inside else 0
          by_instruction[instruction.name] = trips * destination.bytes
        continue
      if op == "custom-call" and "ConcatBitcast" in instruction.attributes:
        continue
      written = sum(a.bytes for a in result_arrays if kept(a))
      if op == "fusion":
        moved = fusion_bytes(instruction, types)
      elif op in _SLICING:  # reads only what it takes
        moved = written + (sum(a.bytes for a in result_arrays)
                           if any(kept(a) for a in operand_arrays[:1]) else 0)
      elif op == "dynamic-update-slice" and written and kept(operand_arrays[0]):
        moved = 2 * operand_arrays[1].bytes if len(operand_arrays) > 1 else 0
      else:
        moved = sum(a.bytes for a in operand_arrays if kept(a)) + written
      total += trips * moved
      looped_once += moved if inside else 0
      by_instruction[instruction.name] = trips * moved
    return total

  total = walk(entry, 1.0)
  return Traffic(total, unknown, by_instruction, looped, looped_once)


class _Module:
  """A compiled program's computations, parsed once: instructions by name, each
  computation's root."""

  def __init__(self, text: str):
    self.lines, self.entry = computations(text)
    self._parsed: dict[str, dict[str, _Instruction]] = {}
    self._roots: dict[str, str] = {}

  def instructions(self, computation: str) -> dict[str, _Instruction]:
    if computation not in self._parsed:
      parsed = {}
      for line in self.lines.get(computation, []):
        instruction = _parse(line)
        if instruction is not None:
          parsed[instruction.name] = instruction
          if line.lstrip().startswith("ROOT"):
            self._roots[computation] = instruction.name
      self._parsed[computation] = parsed
    return self._parsed[computation]

  def root(self, computation: str) -> _Instruction | None:
    found = self.instructions(computation)
    name = self._roots.get(computation)
    return found.get(name) if name else None


def _called(instruction: _Instruction, key: str) -> str | None:
  match = re.search(key + r"=%?([\w.\-]+)", instruction.attributes)
  return match.group(1) if match else None


def _value(module: _Module, computation: str, name: str, depth: int = 0) -> tuple | None:
  """What an instruction computes, as far as a loop counter needs: ``("const", v)``,
  ``("element", i)`` (element i of the computation's tuple parameter), or ``(op, a, b)``
  for ``add``, ``and`` and ``compare`` (``("compare", direction, a, b)``); through
  copies, bitcasts, converts and fusions. ``None`` where it is anything else."""
  instruction = module.instructions(computation).get(name)
  if instruction is None or depth > 16:
    return None
  op, operands = instruction.op, instruction.operands
  if op == "constant":
    match = re.match(r"\((-?\d+)\)", instruction.attributes_and_operands)
    if match:
      return ("const", int(match.group(1)))
    return ("const", 1) if "(true)" in instruction.attributes_and_operands else None
  if op == "get-tuple-element" and operands:
    source = module.instructions(computation).get(operands[0])
    index = re.search(r"index=(\d+)", instruction.attributes)
    if source is not None and source.op == "parameter" and index:
      return ("element", int(index.group(1)))
    return None
  if op in _SAME_VALUE and operands:
    return _value(module, computation, operands[0], depth + 1)
  if op == "fusion":
    fused = _called(instruction, "calls")
    root = module.root(fused) if fused else None
    if root is None:
      return None
    inner = _value(module, fused, root.name, depth + 1)
    return _substitute(inner, lambda i: (_value(module, computation, operands[i], depth + 1)
                                         if i < len(operands) else None))
  if op in ("add", "and") and len(operands) == 2:
    a, b = (_value(module, computation, o, depth + 1) for o in operands)
    # A sum needs both terms; a conjunction is kept with an unknown part ("and" data).
    return (op, a, b) if op == "and" or (a is not None and b is not None) else None
  if op == "compare" and len(operands) == 2:
    direction = re.search(r"direction=(\w+)", instruction.attributes)
    a, b = (_value(module, computation, o, depth + 1) for o in operands)
    return ("compare", direction.group(1) if direction else "", a, b)
  if op == "parameter":
    index = re.match(r"\((\d+)\)", instruction.attributes_and_operands)
    return ("parameter", int(index.group(1))) if index else None
  return None


def _substitute(value: tuple | None, outer) -> tuple | None:
  """A fused computation's value with its parameters replaced by the fusion's operands
  (``outer(i)``: the value of operand i)."""
  if value is None or value[0] == "element":  # a fused computation has no tuple parameter
    return None
  if value[0] == "parameter":
    return outer(value[1])
  if value[0] == "const":
    return value
  return tuple(_substitute(v, outer) if isinstance(v, tuple) else v for v in value)


def _limit(condition: tuple | None) -> tuple[int, str, int, bool] | None:
  """``(counter element, direction, limit, exact)`` of a loop condition ``counter < limit``
  (any direction); ``exact=False`` where the condition is that ``and`` something else."""
  if condition is None:
    return None
  if condition[0] == "and":
    for part in condition[1:]:
      found = _limit(part)
      if found is not None:
        return found[0], found[1], found[2], False
    return None
  if condition[0] != "compare":
    return None
  _, direction, a, b = condition
  flipped = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}
  if a and b and a[0] == "element" and b[0] == "const":
    return a[1], direction, b[1], True
  if a and b and b[0] == "element" and a[0] == "const" and direction in flipped:
    return b[1], flipped[direction], a[1], True
  return None


@dataclasses.dataclass(frozen=True)
class Loop:
  """One while loop of a compiled program and its trip count.

  Attributes:
    name: the instruction's name in the compiled HLO.
    where: the JAX operation it comes from (its ``op_name``), for people.
    trips: how many times its body runs; ``None`` where the program does not say.
    how: ``"known_trip_count"`` (the compiler wrote it), ``"counter"`` (read off the
      counter's start, step and limit), ``"at most"`` (the condition also stops on
      data: ``trips`` is an upper bound) or ``"unknown"``.
  """

  name: str
  where: str
  trips: int | None
  how: str


def _trip_count(module: _Module, computation: str, loop: _Instruction) -> tuple[int | None, str]:
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"', loop.attributes)
  if known:
    return int(known.group(1)), "known_trip_count"
  condition, body = _called(loop, "condition"), _called(loop, "body")
  root = module.root(condition) if condition else None
  limit = _limit(_value(module, condition, root.name)) if root is not None and condition else None
  start_tuple = module.instructions(computation).get(loop.operands[0]) if loop.operands else None
  body_root = module.root(body) if body else None
  if (limit is None or start_tuple is None or start_tuple.op != "tuple" or body_root is None
      or body_root.op != "tuple"):
    return None, "unknown"
  element, direction, bound, exact = limit
  if element >= len(start_tuple.operands) or element >= len(body_root.operands):
    return None, "unknown"
  start = _value(module, computation, start_tuple.operands[element])
  update = _value(module, body, body_root.operands[element])
  if start is None or start[0] != "const" or update is None or update[0] != "add":
    return None, "unknown"
  steps = [v[1] for v in update[1:] if v is not None and v[0] == "const"]
  if len(steps) != 1 or ("element", element) not in update[1:] or steps[0] == 0:
    return None, "unknown"
  first, step = start[1], steps[0]
  span = {"LT": bound - first, "LE": bound - first + (1 if step > 0 else -1),
          "GT": bound - first, "GE": bound - first + (-1 if step < 0 else 1),
          "NE": bound - first}.get(direction)
  if span is None or (direction == "NE" and span % step):
    return None, "unknown"
  trips = max(0, -(-span // step)) if (span > 0) == (step > 0) else 0
  return trips, "counter" if exact else "at most"


def loop_trips(text: str) -> list[Loop]:
  """Every while loop of a compiled program's text, with its trip count (see ``Loop``)."""
  return _loop_trips(_Module(text))


def _exact_trips(loops: list[Loop]) -> dict[str, int]:
  """The loops whose trips are known exactly, by name: what every count multiplies by
  (an upper bound, ``"at most"``, counts one trip, as the compiler does)."""
  return {loop.name: loop.trips for loop in loops
          if loop.trips is not None and loop.how in ("known_trip_count", "counter")}


def _loop_trips(module: _Module) -> list[Loop]:
  found = []
  for computation in module.lines:
    for instruction in module.instructions(computation).values():
      if instruction.op == "while":
        trips, how = _trip_count(module, computation, instruction)
        where = re.search(r'op_name="([^"]*)"', instruction.attributes)
        found.append(Loop(instruction.name, where.group(1) if where else "", trips, how))
  return found


def instruction_flops(module: _Module, computation: str, instruction: _Instruction) -> float:
  """FLOPs of one instruction as XLA's cost analysis counts them (see the module
  docstring); a fusion, those of the instructions it fuses."""
  op = instruction.op
  if op == "fusion":
    fused = _called(instruction, "calls")
    return sum(instruction_flops(module, fused, inner)
               for inner in module.instructions(fused).values()) if fused else 0.0
  result = math.prod(dims(instruction.type_text))
  types = module.instructions(computation)
  operand = lambda i: dims(types[instruction.operands[i]].type_text) if (
      i < len(instruction.operands) and instruction.operands[i] in types) else []
  if op == "dot":
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", instruction.attributes)
    lhs = operand(0)
    inner = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d) if (
        contracting and lhs) else 1
    return 2.0 * result * inner
  if op == "convolution":
    labels = re.search(r"dim_labels=\w+_(\w+)->", instruction.attributes)
    kernel = operand(1)
    if not labels or not kernel or "o" not in labels.group(1):
      return 2.0 * result
    return 2.0 * result * math.prod(kernel) / kernel[labels.group(1).index("o")]
  if op == "reduce":
    return float(math.prod(operand(0)))
  if op in _ARITHMETIC:
    return float(result)
  return 0.0


# Splash attention's Pallas kernels (layers.fused_attention), by name: the matrix
# products each computes per block of queries and keys (forward: Q K^T and P V; the
# backward's dq kernel: Q K^T, dO V^T, dS K; its dk/dv kernel: Q K^T, P^T dO, dO V^T, dS^T Q).
_SPLASH = re.compile(r"splash_mha_(fwd|dq|dkv)")
_SPLASH_PRODUCTS = {"fwd": 2, "dq": 3, "dkv": 4}


def kernel_flops(instruction: _Instruction) -> tuple[str, float] | None:
  """``(kernel, FLOPs)`` of a fused attention kernel's custom call, by formula; None otherwise.

  XLA's cost analysis counts a custom call as no FLOPs (-2 here). A splash call's
  operand layouts name its arrays: block masks ``s8[1, Tb, Sb]`` (Tb x Sb blocks),
  then queries ``[B, H, T, K]`` and keys ``[B, H, S, K]``; a causal mask adds a last
  ``s32`` operand of rank 2 (the query positions it is computed from), and then only
  the ``Tb (Tb + 1) / 2`` blocks on and below the diagonal run. Each product is
  ``2 B H T S K`` FLOPs over the blocks that run.
  """
  if "tpu_custom_call" not in instruction.attributes:
    return None
  kind = _SPLASH.match(instruction.name)
  if not kind:
    return None
  start = instruction.attributes.find("operand_layout_constraints={")
  if start < 0:
    return None
  constraints = _ARRAY.findall(_layouts(instruction.attributes[start:]))
  shapes = [(element, [int(d) for d in sizes.split(",") if d])
            for element, sizes, _ in constraints]
  if len(shapes) < 5:
    return None
  blocks, q, k = shapes[0][1], shapes[2][1], shapes[3][1]
  batch, heads, queries, width = [1] * (4 - len(q)) + q
  keys = k[-2]
  fraction = 1.0
  last_element, last = shapes[-1]
  if last_element == "s32" and len(last) == 2 and len(blocks) == 3:  # causal
    rows = max(blocks[1], blocks[2])
    fraction = (rows + 1) / (2 * rows)
  products = _SPLASH_PRODUCTS[kind.group(1)]
  return "splash attention", products * 2.0 * batch * heads * queries * keys * width * fraction


def _layouts(text: str) -> str:
  """The text of ``operand_layout_constraints={...}``: up to its closing brace."""
  depth = 0
  for i, char in enumerate(text):
    depth += char == "{"
    depth -= char == "}"
    if depth == 0 and char == "}":
      return text[:i + 1]
  return text


@dataclasses.dataclass
class LoopCosts:
  """What XLA's cost analysis leaves out of a program with loops, and its loops.

  Attributes:
    loops: every while loop, with its trip count.
    extra_flops: the FLOPs of each loop body times (trips - 1), nested loops
      multiplied: add to the compiler's ``flops`` for the whole program.
    extra_bytes: the same for bytes accessed.
    flops_in_loops: the FLOPs of the loop bodies counted once each, as the compiler does.
    bytes_in_loops: the same for bytes accessed.
    cycles: the TPU compiler's own estimate of the program's core cycles: the sum of
      the ``estimated_cycles`` it writes on each scheduled instruction, loop bodies
      times their trips (0 where the compiler writes none: XLA's GPU compiler). A
      Pallas kernel's custom call carries none.
    kernel_flops: the FLOPs of the fused attention kernels (``kernel_flops``), every
      trip counted; XLA's cost analysis counts none of them.
    kernel_calls: how many kernel calls a step runs, by kernel.
  """

  loops: list[Loop]
  extra_flops: float = 0.0
  extra_bytes: float = 0.0
  flops_in_loops: float = 0.0
  bytes_in_loops: float = 0.0
  cycles: float = 0.0
  kernel_flops: float = 0.0
  kernel_calls: dict[str, int] = dataclasses.field(default_factory=dict)

  @property
  def counted(self) -> bool:
    """Whether every loop's trips are known exactly, so the totals cover every trip."""
    return all(loop.how in ("known_trip_count", "counter") for loop in self.loops)

  def describe(self) -> str:
    """One phrase on the loops: their trips and how they were read."""
    parts = []
    for loop in self.loops:
      where = _loop_label(loop.where) or loop.name
      trips = ("trips unknown" if loop.trips is None else
               f"at most {loop.trips} trips" if loop.how == "at most" else f"{loop.trips} trips")
      parts.append(f"{where}: {trips}")
    return "; ".join(parts)


def _loop_label(op_name: str) -> str:
  """``"decoder/RNN_0 (backward)"`` for ``jit(f)/transpose(jvp(M))/M.decode/decoder/RNN_0/while``."""
  parts = [p for p in op_name.split("/")[1:] if p != "while" and not p.startswith(
      ("jvp(", "transpose(", "body", "cond"))]
  label = "/".join(parts[-2:])
  return label + (" (backward)" if "transpose(" in op_name else "")


_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')


def loop_costs(text: str) -> LoopCosts:
  """The loops of a compiled program's text and what their uncounted trips cost."""
  module = _Module(text)
  costs = LoopCosts(_loop_trips(module))
  trips = _exact_trips(costs.loops)
  if module.entry is None:
    return costs

  def walk(computation: str, multiplier: int, inside: bool) -> None:
    for instruction in module.instructions(computation).values():
      op = instruction.op
      cycles = _CYCLES.search(instruction.attributes)
      if cycles:
        costs.cycles += int(cycles.group(1)) * multiplier
      if op in _FREE:
        continue
      if op == "while":
        body = _called(instruction, "body")
        count = trips.get(instruction.name)
        if body:
          walk(body, multiplier * (count if count is not None else 1), True)
        continue
      if op in ("call", "conditional", "async-start"):
        for called in re.findall(r"(?:to_apply|calls|branch_computations=\{)=?%?([\w.\-]+)",
                                 instruction.attributes):
          walk(called, multiplier, inside)
        continue
      kernel = kernel_flops(instruction) if op == "custom-call" else None
      if kernel is not None:
        costs.kernel_flops += kernel[1] * multiplier
        costs.kernel_calls[kernel[0]] = costs.kernel_calls.get(kernel[0], 0) + multiplier
      flops = instruction_flops(module, computation, instruction)
      costs.extra_flops += flops * (multiplier - 1)
      costs.flops_in_loops += flops if inside else 0.0

  walk(module.entry, 1, False)
  accessed = hbm_traffic(text, every_memory=True, loops=costs.loops)
  costs.extra_bytes = accessed.in_loops - accessed.in_loops_once
  costs.bytes_in_loops = accessed.in_loops_once
  return costs

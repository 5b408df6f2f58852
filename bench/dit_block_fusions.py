# Inspection: the fused kernels torch.compile (inductor) makes for one DiT block's forward and backward.
"""Compiles one training step of a single DiT block (tests/reference/models.py's DiTBlock, the official DiT's:
adaLN-Zero, LayerNorm without affine, eps 1e-6, modulate, timm Attention with SDPA, tanh-GELU Mlp, gates) with
torch.compile in its default mode, loss = out.square().mean() then backward, and prints for the forward graph and
the backward graph every kernel inductor generated, in launch order: its name, the ATen ops it fuses (the
"Original ATen" origins inductor records for it), its inputs and outputs, and the extern calls between them
(addmm/mm, scaled_dot_product_attention).

    OMP_NUM_THREADS=1 ~/.cache/runner/venv/bin/python bench/dit_block_fusions.py [--dtype float32|bfloat16]
        [--backend cpp|triton] [--device cpu|cuda] [--hidden 64] [--heads 4] [--tokens 16] [--batch 2]

--backend cpp (the default on the CPU) compiles and runs inductor's C++ kernels, whose loop fusion merges more
than Triton's. --backend triton makes inductor schedule and generate Triton kernels (its GPU backend) for the CPU
tensors without running them: no GPU or Triton CPU driver is needed, the kernels are replaced by no-ops (the step's
numbers are garbage), but the fusion groups are Triton's. It also enables the GPU-only rule that moves a Linear's
bias add out of addmm into the pointwise kernel after it (it does not fire in this training graph: every addmm
output is saved for the backward). Not emulated: the other GPU-only scheduler paths (loop reordering after fusion)
and CUDA's SDPA ops (the attention here is the CPU's flash attention, with its own backward). --device cuda runs
the real thing on a GPU. In the table, a tensor is name[shape], <#k when launch k wrote it; primals are named after
the block's parameters; the ATen lists leave out view ops (view, split, permute, ...).
"""

import argparse
import re
import sys
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.triton import TritonScheduling
from torch._inductor.graph import GraphLowering
from torch._inductor.utils import get_kernel_metadata
from torch._inductor.virtualized import V

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reference"))
from models import DiTBlock  # noqa: E402

VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind",
         "permute", "transpose", "t", "expand", "select", "slice", "alias"}

graphs = []        # (generated wrapper code, {kernel name: "Original ATen" list}) per compiled graph, in order
kernel_origins = {}


def record_origins(define_kernel):
    def wrapped(self, src_code, nodes, *rest):
        name = define_kernel(self, src_code, nodes, *rest)
        metadata, _ = get_kernel_metadata(nodes, V.graph.wrapper_code)
        kernel_origins[name] = re.search(r"Original ATen: \[(.*)\]", metadata).group(1)
        return name
    return wrapped


def save_output_code(code):
    graphs.append((code, dict(kernel_origins)))
    kernel_origins.clear()


def run_triton_kernels_nowhere():
    """Let inductor generate Triton kernels for CPU tensors without a Triton CPU driver, and skip running them."""
    import torch._inductor.fx_passes.post_grad as post_grad
    import torch.utils._triton
    from torch._inductor.async_compile import AsyncCompile

    class NoOp:
        def run(self, *args, **kwargs):
            pass

    inductor_config.cpu_backend = "triton"
    torch.utils._triton.triton_hash_with_backend = lambda: "no-driver"
    AsyncCompile.triton = lambda self, kernel_name, source_code, *args, **kwargs: NoOp()
    post_grad.is_gpu = lambda device_type: True  # only asked by should_prefer_unfused_addmm (the bias-add rule)


def top_level_args(text):
    """The comma-separated arguments of a call's argument text, split at depth 0 of the parentheses."""
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return [a for a in args if a]


def tensor_name(arg):
    """buf3 / primals_2 / tangents_1.item() / reinterpret_tensor(buf7, ...) -> the tensor's name, else None."""
    m = re.match(r"(?:reinterpret_tensor\()?([A-Za-z_]\w*)(?:\.item\(\))?", arg)
    return m.group(1) if m and not re.fullmatch(r"\d+|None|True|False|stream\w*", m.group(1)) else None


def kernel_params(code):
    """Kernel name -> its pointer parameters in order (in_ptr0, out_ptr0, in_out_ptr0, ...)."""
    params = {}
    for m in re.finditer(r"^(\w+) = async_compile\.(cpp_pybinding|triton)\(", code, re.M):
        body = code[m.end():]
        sig = re.search(r'extern "C"\s+void\s+kernel\(([^)]*)\)' if m.group(2) == "cpp_pybinding"
                        else r"def \w+\(([^)]*)\)", body)
        params[m.group(1)] = re.findall(r"\b((?:in_out|in|out)_ptr\d+)\b", sig.group(1))
    return params


def describe(code, origins, names):
    """The launches of a graph's call(), in order: (index, kind, name, ATen ops, inputs, outputs)."""
    params = kernel_params(code)
    shapes = dict(re.findall(r"assert_size_stride\((\w+), \(([^)]*)\)", code))
    writer, reused, aliased, fresh, rows, comment = {}, {}, {}, set(), [], ""

    def label(name, reading=False):
        if reading and name not in writer and name in reused:  # memory reused from a dead input: read that
            return label(reused[name], True)
        shape = "[" + ",".join(s.strip() for s in shapes.get(name, "").split(",") if s.strip()) + "]"
        return f"{names.get(name, name)}{shape}" + (f"<#{writer[name]}" if name in writer else "")

    def add(kind, name, aten, inputs, outputs):
        rows.append([len(rows) + 1, kind, name, aten, [label(n, True) for n in inputs], [label(n) for n in outputs]])
        for n in outputs:
            writer[n] = writer[aliased.get(n, n)] = len(rows)  # a slice of a buffer writes the buffer
            fresh.discard(n)

    for line in code[code.index("def call(self, args):"):].splitlines():
        line = line.strip()
        if line.startswith("# Topologically Sorted Source Nodes"):
            comment = re.search(r"Original ATen: \[(.*)\]", line).group(1)
            continue
        if m := re.match(r"(\w+) = empty_strided_\w+\(\(([^)]*)\)", line):
            shapes[m.group(1)] = m.group(2)
            fresh.add(m.group(1))
            continue
        if m := re.match(r"(\w+) = (?:reinterpret_tensor\()?(\w+)(?:, \(([^)]*)\))?.*# (reuse|alias)", line):
            new, old, shape = m.groups()[:3]
            shapes[new] = shape if shape is not None else shapes.get(old, "")
            if old in fresh:
                fresh.add(new)
            elif m.group(4) == "reuse":
                reused[new] = old
            if m.group(4) == "alias":
                aliased[new] = old
            continue
        if m := re.match(r"(\w+) = (\w+)\[(\d+)\]$", line):  # an item of an extern call's tuple result
            row = rows[writer[m.group(2)] - 1]
            row[5] = [o for o in row[5] if not o.startswith(m.group(2) + "[")] + [label(m.group(1))]
            writer[m.group(1)] = row[0]
            continue
        call = re.match(r"(?:(\w+) = )?([\w.]+)\((.*)\)$", line)
        if not call:
            continue
        out, fn, args = call.group(1), call.group(2), top_level_args(call.group(3))
        kernel = fn.removesuffix(".run")
        if kernel in params:
            inputs, outputs = [], []
            for param, arg in zip(params[kernel], args):
                name = tensor_name(arg)
                if param.startswith("in_ptr") or (param.startswith("in_out") and name not in fresh):
                    inputs.append(name)
                if param.startswith(("out_ptr", "in_out")):
                    outputs.append(name)
            add("kernel", kernel, origins.get(kernel, comment), inputs, outputs)
        elif fn.startswith(("extern_kernels.", "torch.ops.")):
            op = fn.split(".")[3] if fn.startswith("torch.ops.") else fn.split(".")[1]
            inputs = [tensor_name(a) for a in args if not re.match(r"\w+=", a)]
            outputs = [a[4:] for a in args if a.startswith("out=")] or [out]
            add("extern", op, comment, [n for n in inputs if n], outputs)
        comment = ""
    return rows


def print_graph(title, rows):
    kernels = [r for r in rows if r[1] == "kernel"]
    print(f"\n{title}: {len(kernels)} fused kernels, {len(rows) - len(kernels)} extern calls")
    print(f"{'#':>3}  {'kernel / [extern] call':<40}  inputs -> outputs")
    for index, kind, name, aten, inputs, outputs in rows:
        ops = [op.removeprefix("aten.") for op in aten.split(", ") if op]
        fused = ", ".join(op for op in ops if op not in VIEWS) or "(views only)"
        shown = name if kind == "kernel" else f"[extern] {name}"
        print(f"{index:>3}  {shown:<40}  {' '.join(inputs)} -> {' '.join(outputs)}")
        if kind == "kernel":
            print(f"{'':>5}fuses: {fused}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--backend", default="cpp", choices=["cpp", "triton"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    a = parser.parse_args()

    inductor_config.force_disable_caches = True  # compile every time, so the code is generated and seen
    if a.backend == "triton" and a.device == "cpu":
        run_triton_kernels_nowhere()
    CppScheduling.define_kernel = record_origins(CppScheduling.define_kernel)
    TritonScheduling.define_kernel = record_origins(TritonScheduling.define_kernel)
    GraphLowering.save_output_code = save_output_code

    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    block = DiTBlock(a.hidden, a.heads, 4).to(a.device, dtype)
    x = torch.randn(a.batch, a.tokens, a.hidden, device=a.device, dtype=dtype, requires_grad=True)
    c = torch.randn(a.batch, a.hidden, device=a.device, dtype=dtype)

    placeholders = []

    def backend(gm, example_inputs):  # the default inductor backend, noting the graph's input names
        from torch._inductor.compile_fx import compile_fx
        placeholders.extend(n.name for n in gm.graph.find_nodes(op="placeholder"))
        return compile_fx(gm, example_inputs)

    step = torch.compile(lambda x, c: block(x, c).square().mean(), backend=backend)
    step(x, c).backward()

    # AOTAutograd's primals_i is the dynamo graph's i-th input: l_block_modules_attn_modules_qkv_parameters_weight_
    names = {f"primals_{i + 1}": re.sub(r"_modules_|_parameters_", ".", re.sub(r"^[lg]_(block_modules_)?|_$", "", p))
             .replace("ada_ln", "adaLN") for i, p in enumerate(placeholders)}
    print(f"DiT block: hidden {a.hidden}, heads {a.heads}, tokens {a.tokens}, batch {a.batch}, {a.dtype}, "
          f"device {a.device}, inductor backend {a.backend}; torch {torch.__version__}")
    print("inputs: " + ", ".join(f"{k}={v}" for k, v in names.items()))
    for (code, origins), title in zip(graphs, ["forward (with the loss)", "backward"]):
        print_graph(title, describe(code, origins, names))


if __name__ == "__main__":
    main()

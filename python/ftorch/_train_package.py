"""Training packages: a model's forward and backward compiled ahead of time by AOTInductor, with its
parameters and buffers kept as state that FTorch owns (``python -m ftorch export MODEL --train FILE.pt2``).

No TorchScript is involved: the model is traced once with its autograd (``make_fx`` of a function
that runs the model and ``torch.autograd.grad`` of its outputs), which gives one graph of the
forward and of the vector-Jacobian product. That graph is split into

* ``forward``: (parameters, buffers, inputs) -> (outputs, new buffers, random values), training mode;
* ``backward``: (parameters, buffers, inputs, random values, output gradients) -> (parameter
  gradients, gradients of the floating-point inputs); it recomputes the forward, taking the random
  values (dropout masks) the forward drew, so both see the same masks;
* ``eval``: (parameters, buffers, inputs) -> outputs, eval mode, only when eval mode computes
  something else than training mode (dropout, batch norm); otherwise ``forward`` serves both;
* ``gradients_eval``: (parameters, buffers, inputs, output gradients) -> the same gradients as
  ``backward``, of the eval-mode forward (only with ``eval``);
* ``infer``: inputs -> outputs, the eval-mode forward with the parameters and buffers as the
  compiled model's constants (``state.K``, not stored in it): FTorch binds its own tensors to them
  (user-managed constants, no copy), so a forward without gradients passes only the inputs.

Each is exported with ``torch.export`` and compiled by AOTInductor into one ``.pt2`` archive, with
the initial parameters and buffers (``ftorch/state.pt``) and what FTorch's C++ layer needs to
know (``extra/ftorch_train.json``). The package is then checked in a child process against eager
autograd: outputs, parameter and input gradients, and the buffers a training forward updates.
"""

from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

FORMAT = "ftorch-train-1"
STATE_RECORD = "ftorch/state.pt"  # not under extra/: torch reads those as text
META_RECORD = "extra/ftorch_train.json"
RECORD_FOR_CPP = "extra/ftorch_train.txt"
STEP_MODEL = "step_mse_adam"  # the compiled training step (MSE loss, Adam or AdamW)
# No model's name may begin with another's: torch 2.11's package loader finds a model's files by
# that prefix ("eval" would load the files of an "eval_backward").
EVAL_BACKWARD_MODEL = "gradients_eval"  # the gradients of the eval-mode forward
INFER_MODEL = "infer"  # the forward without gradients, parameters and buffers as bound constants
STATE_ATTR = "state_{}"  # the infer model's constants: parameters, then buffers, in that order
BATCH = "batch"


def _is_random(node) -> bool:
    import torch

    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags)


def _random_values(graph) -> list:
    """The values random operations produce: the node itself, or the items of a tuple result."""
    values = []
    for node in graph.nodes:
        if not _is_random(node):
            continue
        items = [u for u in node.users if u.op == "call_function" and getattr(u.target, "__name__", "") == "getitem"]
        values.extend(sorted(items, key=lambda u: u.args[1]) if items else [node])
    return values


def _placeholders(graph) -> list:
    return [n for n in graph.nodes if n.op == "placeholder"]


def _functional(model, name: str, pnames: list, ps: list, bnames: list, bs: list, inputs) -> list:
    """The model's outputs (flattened) on parameters ps and buffers bs. A buffer the forward
    assigns anew (``self.m = 0.9 * self.m + ...``, not in place) replaces its entry of bs: torch
    writes the module's new tensor into the dict it was given, and the package keeps it as the
    module would. The new tensor must keep the buffer's shape, dtype and device (FTorch's state)."""
    import torch

    from ._export_errors import UsageError
    from ._export_values import _flatten_outputs, dtype_name

    state = dict(zip(pnames, ps)) | dict(zip(bnames, bs))
    outs = _flatten_outputs(torch.func.functional_call(model, state, tuple(inputs)), name)
    for k, n in enumerate(bnames):
        new = state[n]
        if new is bs[k]:
            continue
        old = bs[k]
        if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype or \
                new.device != old.device:
            what = (f"shape {tuple(new.shape)}, {dtype_name(new.dtype)} on {new.device}"
                    if isinstance(new, torch.Tensor) else type(new).__name__)
            raise UsageError(f"the forward of {name} assigns buffer {n} (shape {tuple(old.shape)}, "
                             f"{dtype_name(old.dtype)} on {old.device}) a value of {what}: a training package "
                             "keeps each buffer's shape, dtype and device; convert the new value, or update the "
                             "buffer in place")
        bs[k] = new.detach()
    return outs


def _same_values(a, b) -> bool:
    """Whether two tensors of one shape and dtype hold the same values, NaN where the other has NaN."""
    import torch

    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def _set_outputs(graph, values) -> None:
    out = next(n for n in graph.nodes if n.op == "output")
    out.args = (tuple(values),)


def _strip_meta(gm) -> None:
    # torch.export traces the graph module again: the fake tensors of the first trace must go.
    for node in gm.graph.nodes:
        for key in ("val", "tensor_meta", "example_value"):
            node.meta.pop(key, None)


def _with_constants(gm, state: list):
    """The graph module with its first len(state) placeholders made constants of its own (buffers
    STATE_ATTR.format(k) holding copies of state[k]): the model AOTInductor compiles for ``infer``;
    and whether it had constants before (tensors the model makes in its forward: they are then
    stored in the compiled code, FTorch's state with them)."""
    g = gm.graph
    had_constants = any(n.op == "get_attr" for n in g.nodes)
    for k, ph in enumerate(_placeholders(g)[:len(state)]):
        name = STATE_ATTR.format(k)
        gm.register_buffer(name, state[k].detach().clone())
        with g.inserting_before(ph):
            attr = g.get_attr(name)
        ph.replace_all_uses_with(attr)
        g.erase_node(ph)
    gm.recompile()
    return gm, had_constants


def _split(joint, n_state_inputs: int, n_outputs: int, n_buffers: int, n_grads: int):
    """(forward, backward, random count) from the joint graph of (state and inputs, output
    gradients) -> (outputs, new buffers, gradients)."""
    fw = copy.deepcopy(joint)
    g = fw.graph
    out = next(n for n in g.nodes if n.op == "output")
    results = list(out.args[0])
    randoms = _random_values(g)
    _set_outputs(g, results[:n_outputs + n_buffers] + randoms)
    g.eliminate_dead_code()
    for ph in _placeholders(g)[n_state_inputs:]:  # the output gradients: not used by the forward
        if ph.users:
            raise RuntimeError("the forward depends on the output gradients")
        g.erase_node(ph)
    fw.recompile()

    bw = copy.deepcopy(joint)
    g = bw.graph
    out = next(n for n in g.nodes if n.op == "output")
    results = list(out.args[0])
    _set_outputs(g, results[n_outputs + n_buffers:])
    first_gradient = _placeholders(g)[n_state_inputs]
    randoms = _random_values(g)
    random_nodes = [n for n in g.nodes if _is_random(n)]
    for k, value in enumerate(randoms):
        with g.inserting_before(first_gradient):
            ph = g.placeholder(f"random_{k + 1}")
        value.replace_all_uses_with(ph)
    for value in randoms:  # the items of tuple results, then the random operations themselves
        if value not in random_nodes:
            g.erase_node(value)
    for node in random_nodes:
        if not node.users:
            g.erase_node(node)
    g.eliminate_dead_code()
    bw.recompile()
    assert n_grads == len(next(n for n in g.nodes if n.op == "output").args[0])
    return fw, bw, len(randoms)


def _as_module(gm):
    """An nn.Module that calls a graph module on its positional arguments (for torch.export)."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gm = gm

        def forward(self, *args):
            return tuple(self.gm(*args))

    return Wrapped()


def _state_dict_record(model) -> str:
    """The state_dict's keys in its order, for train_package.cpp: "key", or "key:name" where the
    tensor is a parameter or buffer named otherwise (tied weights: the state_dict keeps every name,
    named_parameters and named_buffers the first only)."""
    held = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    entries = []
    for key, value in model.state_dict(keep_vars=True).items():
        name = held.get(id(value), key)
        entries.append(key if name == key else f"{key}:{name}")
    return ",".join(entries)


def _rules(program, n_user: int | None, min_batch: int, max_batch: int | None) -> str | None:
    """FTorch's input rules (compiled.cpp parse_rules) for the placeholders of an exported
    program (all of them, or the last n_user): a size or the named dynamic batch per dim."""
    import torch

    items = ["v1"]
    names: dict[str, str] = {}
    # The arguments the compiled model takes: not the constants torch.export lifted out of the code
    # (a torch.tensor made in forward), which AOTInductor keeps inside the package.
    user = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in user]
    for node in placeholders:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        dtype = str(val.dtype).removeprefix("torch.")
        dims = []
        for d in val.shape:
            if isinstance(d, int):
                dims.append(str(d))
                continue
            sym = str(d)
            if not sym.isidentifier():
                return None  # an expression of the batch: leave it to the package's own checks
            names.setdefault(sym, BATCH if not names else f"{BATCH}{len(names) + 1}")
            dims.append(f"{names[sym]}:{min_batch}:{max_batch if max_batch is not None else -1}")
        items.append(f"{dtype}[{','.join(dims)}]")
    if n_user is not None:
        items = ["v1"] + items[len(items) - n_user:]
    return ";".join(items)


def _module_of(program):
    """The graph module AOTInductor compiles, as aoti_compile_and_package takes it from a program."""
    try:
        return program.module(check_guards=False)
    except TypeError:  # torch releases without check_guards
        return program.module()


def _compile(gm, args, dynamic_shapes, metadata: dict, label: str, what: str, min_batch: int,
             max_batch: int | None, constants_in_code: bool = True):
    """AOTInductor files of one graph module (torch.export first) and its exported program."""
    import torch
    import torch._inductor

    from ._export_errors import ExportError, _error_text, _export_error, _quiet

    _strip_meta(gm)
    # Row-major examples: the compiled code assumes the strides it was exported with, and FTorch
    # passes every input contiguous (a random value or an output gradient may come strided).
    args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    captured = io.StringIO()
    try:
        with _quiet(captured):
            program = torch.export.export(_as_module(gm), tuple(args), dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:
        err = _export_error(label, exc, dynamic_shapes is not None)
        raise ExportError(f"{what}: {err}") from None
    metadata = dict(metadata)
    # The inputs FTorch passes: every placeholder, or only the user's when the state is constants.
    rules = _rules(program, None if constants_in_code else len(args), min_batch, max_batch)
    if rules is not None:  # FTorch checks the inputs against these (the package's own checks stay off)
        metadata["ftorch_inputs"] = rules
    options: dict[str, Any] = {"aot_inductor.package": True, "aot_inductor.metadata": metadata}
    if not constants_in_code:  # the loader binds them (load_constants): not a second copy in the file
        options["aot_inductor.package_constants_in_so"] = False
    if what == "inference forward":
        # Every tensor of the state stays a constant that FTorch binds: none inlined into the
        # kernels as numbers (Inductor does so with small ones, e.g. a bias of 3 values).
        options["always_keep_tensor_constants"] = True
    if dynamic_shapes is not None and min_batch < 2:
        options["aot_inductor.check_lowerbound"] = False
    try:
        with _quiet(captured):
            files = torch._inductor.aot_compile(_module_of(program), tuple(args), options=options)
    except Exception as exc:
        hint = " (AOTInductor needs a C++ compiler at export time)" if isinstance(exc, OSError) else ""
        raise ExportError(f"AOTInductor compilation of {label} ({what}) failed: {_error_text(exc)}{hint}") from None
    return files, program


def write(model, name: str, label: str, specs, example: list, dev, path: Path, dynamic_batch: bool,
          min_batch: int, max_batch: int | None) -> dict:
    """Write the training package of ``model`` (see the module's doc) and return its metadata."""
    import torch
    from torch.export.pt2_archive._package import PT2ArchiveWriter, _package_aoti_files
    from torch.fx.experimental.proxy_tensor import make_fx

    import ftorch

    from ._export_errors import ExportError, UsageError, _error_text, _user_frame
    from ._export_values import _flatten_outputs, dtype_name

    pnames = [n for n, _ in model.named_parameters()]
    # Row-major, whatever memory order the module keeps them in (channels-last convolution
    # weights): FTorch holds the state row-major, and the compiled code reads and (the step) writes
    # it in place with the strides it was traced with.
    params = [p.detach().contiguous() for _, p in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    buffers = [b.detach().contiguous() for _, b in model.named_buffers()]
    for n, p in zip(pnames, params):
        if not p.is_floating_point():
            raise UsageError(f"parameter {n} has dtype {p.dtype}: a training package trains floating-point "
                             "parameters only")
    xs = [t.contiguous() for t in example]
    if dynamic_batch:  # torch.export specializes sizes 0 and 1: trace with a batch of at least 2
        xs = [torch.cat([a] * 2) if a.shape[0] == 1 else a for a in xs]
    grad_inputs = [i for i, x in enumerate(xs) if x.is_floating_point()]
    was_training = model.training

    def run(ps, bs, inputs, training: bool) -> list:
        model.train(training)
        return _functional(model, name, pnames, ps, bnames, bs, inputs)

    try:
        outs = run(params, [b.clone() for b in buffers], xs, True)
    except UsageError:
        raise
    except Exception as exc:
        raise ExportError(f"{label}: the training-mode forward fails on the example inputs: {_error_text(exc)}"
                          f"{_user_frame(exc, None)}") from None
    finally:
        model.train(was_training)
    for k, o in enumerate(outs):
        if not o.is_floating_point():
            raise UsageError(f"output {k + 1} of {label} has dtype {o.dtype}: a training package needs "
                             "floating-point outputs (gradients flow through them)")
    n_p, n_b, n_x, n_o = len(params), len(buffers), len(xs), len(outs)
    n_grads = n_p + len(grad_inputs)

    unused: set[int] = set()  # parameters whose gradient autograd leaves None (not used by forward)

    def vjp(flat, training: bool, bs: list):
        """(outputs, gradients) of the forward in the given mode on (state, inputs, output gradients):
        the gradients of the parameters and floating-point inputs, None where autograd leaves none."""
        ps = [p.detach().requires_grad_(True) for p in flat[:n_p]]
        inputs = list(flat[n_p + n_b:n_p + n_b + n_x])
        for i in grad_inputs:
            inputs[i] = inputs[i].detach().requires_grad_(True)
        gs = flat[n_p + n_b + n_x:]
        with torch.enable_grad():
            results = run(ps, bs, inputs, training)
            wrt = ps + [inputs[i] for i in grad_inputs]
            live = [k for k, r in enumerate(results) if r.requires_grad]
            grads = torch.autograd.grad([results[k] for k in live], wrt, [gs[k] for k in live],
                                        allow_unused=True) if live else [None] * len(wrt)
        return results, [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)], grads

    def joint(*flat):
        bs = [b.clone() for b in flat[n_p:n_p + n_b]]  # a training forward updates copies
        results, grads, raw = vjp(flat, True, bs)
        unused.update(k for k, g in enumerate(raw[:n_p]) if g is None)
        return (*[r.detach() for r in results], *[b.detach() for b in bs], *grads)

    def eval_joint(*flat):  # the gradients of the eval-mode forward (batch norm on its statistics)
        return tuple(vjp(flat, False, list(flat[n_p:n_p + n_b]))[1])

    def forward_only(training: bool):
        def f(*flat):
            with torch.no_grad():
                return tuple(run(list(flat[:n_p]), [b.clone() for b in flat[n_p:n_p + n_b]],
                                 list(flat[n_p + n_b:]), training))
        return f

    def changed_buffers(training: bool) -> list:
        """The names of the buffers the forward in this mode changes (in place, or assigned anew)."""
        given = [b.clone() for b in buffers]
        versions = [b._version for b in given]  # (an in-place change advances it, with or without grad)
        bs = list(given)
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev]):
                run(params, bs, xs, training)
        except Exception as exc:
            raise ExportError(f"{label}: the {'training' if training else 'eval'}-mode forward fails on the "
                              f"example inputs: {_error_text(exc)}{_user_frame(exc, None)}") from None
        finally:
            model.train(was_training)
        # (by value too: a change through `.data` advances another version counter)
        return [n for n, b, new, v, old in zip(bnames, given, bs, versions, buffers)
                if new is not b or b._version != v or not _same_values(b, old)]

    gs = [torch.randn_like(o) for o in outs]
    mode = "symbolic" if dynamic_batch else "fake"
    try:
        with torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev]):
            joint_gm = make_fx(joint, tracing_mode=mode)(*params, *buffers, *xs, *gs)
            # Without in-place operations: a random value the forward hands to the backward must
            # be the value as drawn (CPU dropout draws a mask with bernoulli_ and scales it in
            # place; the backward would scale it again).
            joint_gm = make_fx(torch.func.functionalize(joint_gm), tracing_mode=mode)(*params, *buffers, *xs, *gs)
            train_gm = make_fx(forward_only(True), tracing_mode=mode)(*params, *buffers, *xs)
            eval_gm = make_fx(forward_only(False), tracing_mode=mode)(*params, *buffers, *xs)
            infer_gm = make_fx(forward_only(False), tracing_mode=mode)(*params, *buffers, *xs)
            eval_bw_gm = make_fx(eval_joint, tracing_mode=mode)(*params, *buffers, *xs, *gs)
    except Exception as exc:
        raise ExportError(f"cannot trace the forward and backward of {label}: {_error_text(exc)}"
                          f"{_user_frame(exc, None)}") from None
    finally:
        model.train(was_training)
    # The whole training step of torch_train_step with an MSE loss and Adam or AdamW, compiled as
    # one graph: forward, loss, backward, gradient-norm clipping, the update, all in place on the
    # state FTorch passes (parameters, buffers, gradients, the optimizer's moments). The
    # optimizer's settings come each step as numbers (STEP_SETTINGS), so any Adam/AdamW settings
    # and a learning-rate schedule use the same code. The arithmetic is written as LibTorch's Adam,
    # AdamW and clip_grad_norm_ compute it, operation for operation.
    step_gm = None
    if n_o >= 1:
        def step(*flat):
            k = 0

            def take(n):
                nonlocal k
                k += n
                return list(flat[k - n:k])

            ps, bs, grads_out, m1, m2 = take(n_p), take(n_b), take(n_p), take(n_p), take(n_p)
            (h,) = take(1)
            inputs, (target,) = take(n_x), take(1)
            h = h.to(ps[0].dtype)
            b1, one_b1, b2, one_b2, eps, l2, decay, step_size, sqrt_bc2, max_norm, mean = (h[i] for i in range(11))
            leaf = [p.detach().requires_grad_(True) for p in ps]
            bs_new = [b.clone() for b in bs]
            with torch.enable_grad():
                pred = run(leaf, bs_new, inputs, True)[0]
                loss = torch.where(mean > 0, torch.nn.functional.mse_loss(pred, target, reduction="mean"),
                                   torch.nn.functional.mse_loss(pred, target, reduction="sum"))
                gs_ = torch.autograd.grad(loss, leaf, allow_unused=True)
            gs_ = [torch.zeros_like(p) if g is None else g for g, p in zip(gs_, ps)]
            with torch.no_grad():
                total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs_]))
                coef = max_norm / (total + 1e-6)
                clip = (max_norm > 0) & (coef < 1)
                gs_ = [torch.where(clip, g * coef, g) for g in gs_]
                for p, g, g_out, ma, mb in zip(ps, gs_, grads_out, m1, m2):
                    g_out.copy_(g)
                    p.mul_(decay)
                    g = g + l2 * p
                    ma.copy_(ma * b1 + one_b1 * g)
                    mb.copy_(mb * b2 + (one_b2 * g) * g)
                    denom = mb.sqrt() / sqrt_bc2 + eps
                    p.copy_(p + (-step_size * ma) / denom)
                for b, new in zip(bs, bs_new):
                    b.copy_(new)
            return (loss.detach(),)

    fw_gm, bw_gm, n_random = _split(joint_gm, n_p + n_b + n_x, n_o, n_b, n_grads)
    # A forward without gradients in eval mode runs `infer`, which leaves the buffers as they are:
    # the eval-mode forward must not change any (an update not under `if self.training:`). Then a
    # training forward that changes one is never eval_same (its code has the update, which make_fx
    # keeps even where no output reads it), and its forwards without gradients run `forward`.
    eval_changes = changed_buffers(False)
    if eval_changes:
        raise UsageError(f"the eval-mode forward of {label} changes buffer {eval_changes[0]}: a training package "
                         "runs eval-mode forwards without changing the model (as batch norm's eval mode does); "
                         "update the buffer in training mode only (under `if self.training:`)")
    eval_same = train_gm.code == eval_gm.code and n_random == 0

    # Dynamic batch: dim 0 of every input; an output's (and its gradient's) dims that follow the
    # batch, found by running the model on another batch size.
    batch_dim = None
    out_batch_dims: list[list[int]] = [[] for _ in outs]
    if dynamic_batch:
        kwargs = {"min": min_batch} | ({"max": max_batch} if max_batch is not None else {})
        batch_dim = torch.export.Dim(BATCH, **kwargs)
        b = xs[0].shape[0]
        other = [torch.cat([x, x[:1]]) for x in xs]
        with torch.no_grad():
            outs2 = run(params, [b_.clone() for b_ in buffers], other, False)
        model.train(was_training)
        for k, (o1, o2) in enumerate(zip(outs, outs2)):
            out_batch_dims[k] = [d for d, (s1, s2) in enumerate(zip(o1.shape, o2.shape)) if s1 == b and s2 == b + 1]
            if o1.dim() != o2.dim() or any(s1 != s2 for d, (s1, s2) in enumerate(zip(o1.shape, o2.shape))
                                           if d not in out_batch_dims[k]):
                raise ExportError(f"output {k + 1} of {label} changes shape with the batch size in a way other than "
                                  "along a dimension of the batch size: drop --dynamic-batch")

    def shapes(n_static: int, tensors_batched: list[list[int]]):
        if batch_dim is None:
            return None
        return (tuple([None] * n_static + [{d: batch_dim for d in dims} for dims in tensors_batched]),)

    x_dims = [[0] for _ in xs]
    with torch.no_grad(), torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev]):
        rnd = fw_gm(*params, *buffers, *xs)[n_o + n_b:]
    rnd_dims = [[d for d, s in enumerate(r.shape) if s == xs[0].shape[0]] if batch_dim is not None else []
                for r in rnd]
    meta_common = {"ftorch_format": FORMAT}
    aoti: dict[str, list] = {}
    try:
        files, fw_program = _compile(fw_gm, [*params, *buffers, *xs],
                                     shapes(n_p + n_b, x_dims), meta_common, label, "forward", min_batch, max_batch)
        aoti["forward"] = files
        files, bw_program = _compile(bw_gm, [*params, *buffers, *xs, *rnd, *gs],
                                     shapes(n_p + n_b, x_dims + rnd_dims + out_batch_dims), meta_common, label,
                                     "backward", min_batch, max_batch)
        aoti["backward"] = files
        if n_o >= 1:
            zeros = [torch.zeros_like(p) for p in params]
            settings = torch.tensor([0.9, 0.1, 0.999, 0.001, 1e-8, 0.0, 1.0, 0.001, 1.0, 0.0, 1.0], dtype=torch.float64,
                                    device=dev)
            target = torch.randn_like(outs[0])
            step_args = [*[p.clone() for p in params], *[b.clone() for b in buffers], *zeros,
                         *[z.clone() for z in zeros], *[z.clone() for z in zeros], settings, *xs, target]
            try:
                with torch.random.fork_rng(devices=[] if dev.type == "cpu" else [dev]):
                    step_gm = make_fx(step, tracing_mode=mode)(*step_args)
            finally:
                model.train(was_training)
            files, _ = _compile(step_gm, step_args, shapes(n_p + n_b + 3 * n_p + 1, x_dims + [out_batch_dims[0]]),
                                meta_common, label, "training step", min_batch, max_batch)
            aoti[STEP_MODEL] = files
        if not eval_same:
            files, _ = _compile(eval_gm, [*params, *buffers, *xs], shapes(n_p + n_b, x_dims), meta_common, label,
                                "eval", min_batch, max_batch)
            aoti["eval"] = files
            files, _ = _compile(eval_bw_gm, [*params, *buffers, *xs, *gs],
                                shapes(n_p + n_b, x_dims + out_batch_dims), meta_common, label, "eval-mode backward",
                                min_batch, max_batch)
            aoti[EVAL_BACKWARD_MODEL] = files
        infer_gm, had_constants = _with_constants(infer_gm, [*params, *buffers])
        files, _ = _compile(infer_gm, list(xs), shapes(0, x_dims), meta_common, label, "inference forward",
                            min_batch, max_batch, constants_in_code=had_constants)
        aoti[INFER_MODEL] = files
    finally:
        model.train(was_training)

    def described(names, tensors, grads=None):
        return [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                 **({"requires_grad": bool(g)} if grads is not None else {})}
                for n, t, g in zip(names, tensors, grads if grads is not None else [None] * len(names))]

    def sym_shape(t, dims):
        return [BATCH if d in dims else int(s) for d, s in enumerate(t.shape)]

    infer_fqns = ["gm." + STATE_ATTR.format(k) for k in range(n_p + n_b)]  # gm: _as_module's attribute
    meta = {
        "format": FORMAT,
        "model": name,
        "ftorch_version": ftorch.__version__,
        "torch_version": torch.__version__,
        "device": dev.type,
        "parameters": described(pnames, params, [p.requires_grad for _, p in model.named_parameters()]),
        "buffers": described(bnames, buffers),
        "inputs": [{"name": s.name, "shape": sym_shape(x, [0] if dynamic_batch else []), "dtype": s.dtype}
                   for s, x in zip(specs, xs)],
        "outputs": [{"shape": sym_shape(o, dims), "dtype": dtype_name(o.dtype)} for o, dims in zip(outs, out_batch_dims)],
        "input_gradients": [i + 1 for i in grad_inputs],
        "random_values": n_random,
        "eval": "forward" if eval_same else "eval",
        "eval_backward": None if eval_same else EVAL_BACKWARD_MODEL,
        "infer": INFER_MODEL,
        "infer_state": infer_fqns,
        "step": STEP_MODEL if n_o >= 1 else None,
        "dynamic_batch": [min_batch, max_batch] if dynamic_batch else None,
        "input_rules": _rules(fw_program, n_x, min_batch, max_batch),
        "forward_rules": _rules(fw_program, None, min_batch, max_batch),
        "backward_rules": _rules(bw_program, None, min_batch, max_batch),
    }
    # The same for FTorch's C++ layer (train_package.cpp), as key=value lines.
    record = {
        "format": FORMAT,
        "parameters": ",".join(pnames),
        "requires_grad": ",".join("1" if p.requires_grad else "0" for _, p in model.named_parameters()),
        "buffers": ",".join(bnames),
        # What torch_model_save writes as the state_dict, in its order (no non-persistent buffers).
        "state_dict": _state_dict_record(model),
        "inputs": n_x,
        "outputs": n_o,
        "random_values": n_random,
        "input_gradients": ",".join(str(i + 1) for i in grad_inputs),
        "unused_parameters": ",".join(str(k + 1) for k in sorted(unused)),
        "eval": meta["eval"],
        "input_rules": meta["input_rules"] or "",
        "step": STEP_MODEL if STEP_MODEL in aoti else "",
        "eval_backward": EVAL_BACKWARD_MODEL if EVAL_BACKWARD_MODEL in aoti else "",
        "infer": INFER_MODEL,
        # The infer model's constants, parameters then buffers (their names in the compiled model).
        "infer_state": ",".join(infer_fqns),
    }
    state = io.BytesIO()
    torch.save({"parameters": [p.cpu() for p in params], "buffers": [b.cpu() for b in buffers]}, state)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    with PT2ArchiveWriter(os.fspath(path)) as writer:
        _package_aoti_files(writer, aoti)
        writer.write_bytes(STATE_RECORD, state.getvalue())
        writer.write_string(META_RECORD, json.dumps(meta))
        writer.write_string(RECORD_FOR_CPP, "".join(f"{k}={v}\n" for k, v in record.items()))
    return {"meta": meta, "backward_graph": bw_gm, "grad_inputs": grad_inputs, "pnames": pnames, "bnames": bnames,
            "infer_state": infer_fqns}


def check(model, name: str, path: Path, written: dict, example: list, second: list, draw, extra_batches: list,
          rtol, atol, gen, report) -> None:
    """Run the package in a child process (training forward, backward, eval forward) on the example,
    a second draw and other batch sizes, and compare with eager autograd: outputs, updated buffers,
    parameter and input gradients, eval-mode outputs. With random operations (dropout) the
    training forward draws other numbers than eager PyTorch: the backward is then compared with the
    traced backward graph run eagerly on the package's random values, the eval mode with eager."""
    import torch

    from ._export_errors import _error_text
    from ._export_pt2 import _run_pt2_in_child, package_input
    from ._export_report import FileCheck, RunCheck, _compare
    from ._export_values import _flatten_outputs

    meta = written["meta"]
    pnames, bnames, grad_inputs = written["pnames"], written["bnames"], written["grad_inputs"]
    params = [p.detach().contiguous() for _, p in model.named_parameters()]  # (as written)
    buffers = [b.detach().contiguous() for _, b in model.named_buffers()]
    n_o, n_b, n_r = len(meta["outputs"]), len(buffers), meta["random_values"]
    was_training = model.training

    def eager(args, gs):
        ps = [p.clone().requires_grad_(True) for p in params]
        bs = [b.clone() for b in buffers]
        xs = [a.contiguous().clone() for a in args]
        for i in grad_inputs:
            xs[i].requires_grad_(True)
        model.train(True)
        try:
            with torch.enable_grad():
                outs = _functional(model, name, pnames, ps, bnames, bs, xs)
                wrt = ps + [xs[i] for i in grad_inputs]
                live = [k for k, o in enumerate(outs) if o.requires_grad]
                grads = torch.autograd.grad([outs[k] for k in live], wrt, [gs[k] for k in live], allow_unused=True)
            model.eval()
            with torch.no_grad():
                evals = _functional(model, name, pnames, params, bnames, list(buffers), xs)
            eval_grads = None
            if meta.get("eval_backward"):  # the eval-mode gradients, on the buffers as they were
                ps = [p.clone().requires_grad_(True) for p in params]
                xs = [a.contiguous().clone() for a in args]
                for i in grad_inputs:
                    xs[i].requires_grad_(True)
                with torch.enable_grad():
                    outs_e = _functional(model, name, pnames, ps, bnames, list(buffers), xs)
                    wrt_e = ps + [xs[i] for i in grad_inputs]
                    live = [k for k, o in enumerate(outs_e) if o.requires_grad]
                    eval_grads = torch.autograd.grad([outs_e[k] for k in live], wrt_e, [gs[k] for k in live],
                                                     allow_unused=True)
                eval_grads = [torch.zeros_like(w) if g is None else g.detach() for g, w in zip(eval_grads, wrt_e)]
        finally:
            model.train(was_training)
        grads = [torch.zeros_like(w) if g is None else g for g, w in zip(grads, wrt)]
        return [o.detach() for o in outs], bs, [g.detach() for g in grads], evals, eval_grads

    runs_spec = [("example inputs", example), ("second draw", second)]
    runs_spec += [(f"batch {b}", draw(b)) for b in extra_batches]
    refs = []
    fc = FileCheck(str(path), "train", "the package's forward, backward and eval models in a child process, "
                                       "compared with eager autograd")
    kept = []
    for label, args in runs_spec:
        # Output gradients: random, of the outputs' shapes on these inputs.
        with torch.no_grad():
            model.train(True)
            shapes = [o.shape for o in _functional(model, name, pnames, params, bnames,
                                                   [b.clone() for b in buffers], [a.contiguous() for a in args])]
            model.train(was_training)
        gs = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype=params[0].dtype if params else torch.float32,
                                                                      device=args[0].device) for s in shapes]
        try:
            refs.append((args, gs, eager(args, gs)))
            kept.append((label, args))
        except Exception as exc:
            fc.runs.append(RunCheck(label, [], f"eager PyTorch fails on these inputs: {_error_text(exc)}"))
            if label == "batch 1":
                fc.note = "the model does not train on a batch of 1 (batch norm?): export with --min-batch 2"
    runs_spec = kept

    # Child process, step 1: training forwards and eval forwards. Step 2: backwards on the random
    # values step 1 drew.
    # The infer model (if the package has one) gets the state as its constants, and the inputs:
    # parameters other than the exported ones (scaled by 1.25), so that a parameter the compiled
    # code holds as numbers of its own, not reading the bound tensor, cannot pass.
    infer = meta.get("infer")
    moved = [p * 1.25 for p in params]
    constants = {infer: dict(zip(written["infer_state"], [package_input(t) for t in moved + buffers]))} if infer else None
    calls, models = [], []
    for args, _, _ in refs:
        state = [package_input(t) for t in params + buffers]
        xs = [package_input(a) for a in args]
        calls.append(state + xs)
        models.append("forward")
        if meta["eval"] == "eval":
            calls.append(state + xs)
            models.append("eval")
        if infer:
            calls.append(xs)
            models.append(infer)
    load_error, results = _run_pt2_in_child(path, calls, models, constants)
    if load_error is not None:
        fc.runs.append(RunCheck("load", [], load_error))
        report.checks.append(fc)
        return
    forwards = iter(results)
    back_calls, back_refs = [], []
    eval_back_calls, eval_back_refs = [], []
    for (label, _), (args, gs, (outs, bs, grads, evals, eval_grads)) in zip(runs_spec, refs):
        fw = next(forwards)
        ev = next(forwards) if meta["eval"] == "eval" else None
        inf = next(forwards) if infer else None
        if inf is not None:
            if "error" in inf:
                fc.runs.append(RunCheck(f"{label} (inference)", [], inf["error"]))
            else:
                was = model.training
                model.eval()
                try:
                    with torch.no_grad():
                        ref = _functional(model, name, pnames, moved, bnames, list(buffers),
                                          [a.contiguous() for a in args])
                finally:
                    model.train(was)
                fc.runs.append(RunCheck(f"{label} (inference, other parameters)",
                                        _compare(ref, inf["outputs"][:n_o], rtol, atol)))
        if eval_grads is not None:
            eval_back_calls.append([package_input(t) for t in params + buffers] + [package_input(a) for a in args] +
                                   [package_input(g) for g in gs])
            eval_back_refs.append((f"{label} (eval-mode backward)", eval_grads))
        if "error" in fw:
            fc.runs.append(RunCheck(f"{label} (forward)", [], fw["error"]))
            back_refs.append(None)
            continue
        got = fw["outputs"]
        if n_r == 0:
            run = RunCheck(f"{label} (train)", _compare(outs + bs, got[:n_o + n_b], rtol, atol))
            for k, o in enumerate(run.outputs):
                o.name = f"output {k + 1}" if k < n_o else f"buffer {bnames[k - n_o]}"
            fc.runs.append(run)
        evals_got = (ev or fw)
        if "error" in evals_got:
            fc.runs.append(RunCheck(f"{label} (eval)", [], evals_got["error"]))
        else:
            run = RunCheck(f"{label} (eval)", _compare(evals, evals_got["outputs"][:n_o], rtol, atol))
            fc.runs.append(run)
        randoms = got[n_o + n_b:]
        state = [package_input(t) for t in params + buffers]
        back_calls.append(state + [package_input(a) for a in args] + [package_input(r) for r in randoms] +
                          [package_input(g) for g in gs])
        if n_r:  # the traced backward, eagerly, on the same random values
            with torch.no_grad():
                grads = list(written["backward_graph"](*params, *buffers, *[a.contiguous() for a in args],
                                                       *randoms, *gs))
        back_refs.append((label, grads))
    back_refs = [(f"{label} (backward)", grads) for label, grads in (r for r in back_refs if r is not None)]
    calls = back_calls + eval_back_calls
    if calls:
        load_error, results = _run_pt2_in_child(path, calls, ["backward"] * len(back_calls) +
                                                [meta["eval_backward"]] * len(eval_back_calls))
        if load_error is not None:
            fc.runs.append(RunCheck("load backward", [], load_error))
        else:
            names = [f"gradient of {n}" for n in pnames] + [f"gradient of input {i + 1}" for i in grad_inputs]
            for (label, grads), res in zip(back_refs + eval_back_refs, results):
                if "error" in res:
                    fc.runs.append(RunCheck(label, [], res["error"]))
                    continue
                run = RunCheck(label, _compare(grads, res["outputs"], rtol, atol))
                for o, nm in zip(run.outputs, names):
                    o.name = nm
                fc.runs.append(run)
    if n_r and not fc.note:
        fc.note = ("the model draws random numbers in training mode (dropout): the training forward's outputs "
                   "differ from eager PyTorch's draw; the backward was compared on the package's own draw")
    report.checks.append(fc)


def read_meta(path) -> dict | None:
    """The training metadata of a package, or None when it is not a training package."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.endswith("/" + META_RECORD) or n == META_RECORD]
            if not names:
                return None
            return json.loads(zf.read(names[0]))
    except (zipfile.BadZipFile, OSError, ValueError):
        return None

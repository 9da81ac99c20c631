"""The facts of one vLLM release that the sizing filter uses (one row of plugins/plugin_utils/vllm_sizing/releases.json),
read from that release's Python source: tools/vllm_release.py prints, checks and writes them.

vLLM is never imported (torch is not installed, and a release must be readable without installing it). Facts come
from the AST, and pure functions whose output is the fact (the backend priority order, a platform's block-size
code, an environment variable's default, ...) are cut out of the source and run with stub globals.

Every extractor recognises the source shapes it was written for and raises ShapeError (release, file, function,
what it expected) on any other, so that a release with new logic fails loudly instead of getting a wrong row; the
message says what to teach this module. Stubs are strict where they can be: a name or attribute they do not know
is a ShapeError, not a guess.

Runtime facts the source cannot settle are assumed as an official CUDA build has them: FlashAttention 3 and FlashMLA
built for Hopper, FlashInfer installed (TRT-LLM attention on Blackwell), kv_cache_dtype auto for the block size, a
dense (not sparse) DeepSeek-like MLA model; on CPU, x86 without IPEX (0.11.0), AMX or not as the row says.
"""

import ast
import builtins
import inspect
import itertools
import os
import re
import types
from collections import namedtuple

# Compute capabilities wherever a fact depends on the GPU (schema CC_GRID).
CC_GRID = ("7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")
# Block sizes tried where a platform's code decides what it keeps (the BlockSize Literal when the release has one).
PROBE_BLOCKS = (1, 8, 16, 32, 64, 128, 256)
GiB = 1 << 30


class ShapeError(Exception):
    """The source does not have a shape this module knows: the message says where and what was expected."""


class Release:
    """One release's source tree (<root>/vllm/...), parsed on demand."""

    def __init__(self, root, version):
        self.root, self.version, self._trees, self._memo = root, version, {}, {}

    def memo(self, key, make):
        """make() once per release and key (compiled code, class copies)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def fail(self, rel, where, expected):
        raise ShapeError("vLLM %s: vllm/%s %s: expected %s; teach tools/vllm_source.py this shape"
                         % (self.version, rel, where, expected))

    def has(self, rel):
        return os.path.exists(os.path.join(self.root, "vllm", rel))

    def text(self, rel):
        return self._parsed(rel)[0]

    def tree(self, rel):
        return self._parsed(rel)[1]

    def _parsed(self, rel):
        if rel not in self._trees:
            path = os.path.join(self.root, "vllm", rel)
            if not os.path.exists(path):
                self.fail(rel, "(file)", "this file to exist")
            with open(path, encoding="utf-8") as f:
                text = f.read()
            self._trees[rel] = (text, ast.parse(text, path))
        return self._trees[rel]

    def first(self, rels):
        """The first of rels that exists (None: none does)."""
        return next((rel for rel in rels if self.has(rel)), None)

    def cls(self, rel, name, required=True):
        node = next((n for n in self.tree(rel).body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if node is None and required:
            self.fail(rel, name, "class %s" % name)
        return node

    def function(self, rel, qualname, required=True):
        """A module-level function ("f") or a method ("Class.f") of rel."""
        body = self.tree(rel).body
        *classes, name = qualname.split(".")
        for cls_name in classes:
            node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
            body = node.body if node else []
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                    None)
        if node is None and required:
            self.fail(rel, qualname, "function %s" % qualname)
        return node

    def module_assign(self, rel, name):
        """The value node of a module-level `name = ...` (None: absent)."""
        for node in self.tree(rel).body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == name and node.value is not None:
                return node.value
        return None

    def class_field(self, rel, cls_name, name):
        """The AnnAssign/Assign node of a class attribute (None: absent)."""
        for node in self.cls(rel, cls_name).body:
            target = node.target if isinstance(node, ast.AnnAssign) else \
                node.targets[0] if isinstance(node, ast.Assign) else None
            if isinstance(target, ast.Name) and target.id == name:
                return node
        return None

    def imports(self, rel):
        """Imported name -> dotted path ("vllm.x.y.Name") of rel's `from ... import` statements."""
        return {a.asname or a.name: "%s.%s" % (n.module, a.name) for n in ast.walk(self.tree(rel))
                if isinstance(n, ast.ImportFrom) and n.module for a in n.names}


def module_rel(release, dotted_module):
    """vllm.a.b -> a/b.py or a/b/__init__.py (None: not vLLM's)."""
    parts = dotted_module.split(".")
    if parts[0] != "vllm":
        return None
    rel = "/".join(parts[1:]) + ".py"
    return rel if release.has(rel) else release.first(["/".join(parts[1:]) + "/__init__.py"])


def unparse(node):
    return ast.unparse(node) if node is not None else ""


def literal(node, names=None):
    """A literal value (tuples, lists, sets, frozenset(...), ints, strings, unary minus, N * M) or raise
    ValueError; names maps Name ids to values."""
    if isinstance(node, ast.Call) and unparse(node.func) in ("frozenset", "set", "tuple", "list") and \
            len(node.args) <= 1 and not node.keywords:
        return {"frozenset": frozenset, "set": set, "tuple": tuple, "list": list}[unparse(node.func)](
            literal(node.args[0], names) if node.args else ())
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.LShift)):
        left, right = literal(node.left, names), literal(node.right, names)
        return left * right if isinstance(node.op, ast.Mult) else left << right
    if isinstance(node, ast.Name) and names and node.id in names:
        return names[node.id]
    return ast.literal_eval(node)


# ----------------------------------------------------------------------------------------------- running source
class Strict:
    """A stub object: the attributes given, and a ShapeError-worthy AttributeError for any other."""

    def __init__(self, name, **attrs):
        self.__dict__.update(attrs)
        self.__dict__["_name"] = name

    def __getattr__(self, attr):
        raise AttributeError("stub %s has no attribute %r" % (self._name, attr))


class Anything:
    """Absorbs any use (loggers, objects whose state does not decide the fact)."""

    def __getattr__(self, name):
        return Anything()

    def __call__(self, *args, **kwargs):
        return Anything()

    def __bool__(self):
        return False


class MultipleOf:
    """A backend's MultipleOf(base) kernel block size (any multiple of base)."""

    def __init__(self, base):
        self.base = base


class Members(type):
    """AttentionBackendEnum / _Backend stand-in: each member is its own name."""

    def __getattr__(cls, name):
        return name


class Enum(metaclass=Members):
    pass


class DC(namedtuple("DC", "major minor")):
    """DeviceCapability."""

    def to_int(self):
        return self.major * 10 + self.minor


def capability(cc):
    major, minor = cc.split(".")
    return DC(int(major), int(minor))


class Device:
    """current_platform on a CUDA device; cc can be changed between calls of code compiled against it."""

    def __init__(self, cc):
        self.cc = cc

    @property
    def cap(self):
        return capability(self.cc)

    def is_device_capability(self, c):
        return self.cap.to_int() == c if isinstance(c, int) else self.cap == tuple(c)

    def has_device_capability(self, c):
        return self.cap.to_int() >= c if isinstance(c, int) else self.cap >= tuple(c)

    def is_device_capability_family(self, c):
        return self.cap.to_int() // 10 == c // 10

    def get_device_capability(self, device_id=0):
        return self.cap

    def is_cuda(self):
        return True

    def is_cuda_alike(self):
        return True

    def is_rocm(self):
        return False

    is_xpu = is_cpu = is_tpu = is_unspecified = is_rocm


def platform(cc):
    return Device(cc)


class _StripImports(ast.NodeTransformer):
    """Cut-out code runs without its imports (the stubs stand for them) and without annotations."""

    def visit_Import(self, node):
        return ast.Pass()

    visit_ImportFrom = visit_Import

    def visit_AnnAssign(self, node):
        if node.value is None:
            return ast.Pass()
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        node.returns = None
        for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
            arg.annotation = None
        for arg in (node.args.vararg, node.args.kwarg):
            if arg:
                arg.annotation = None
        node.decorator_list = [d for d in node.decorator_list if unparse(d) in ("classmethod", "staticmethod")]
        return node


def compile_nodes(nodes, stubs, keep=None):
    """Namespace after running the given function/class nodes (copies, imports and annotations stripped; a
    function cut to its first `keep` statements) in stub globals."""
    body = []
    for node in nodes:
        node = _StripImports().visit(ast.parse(ast.unparse(node)).body[0])
        if isinstance(node, ast.FunctionDef):  # a method run on its own takes its class (or self) as an argument
            node.decorator_list = []
        if keep is not None:
            node.body = node.body[:keep] or [ast.Pass()]
        body.append(node)
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    namespace = {"logger": Anything(), "AttentionBackendEnum": Enum, "_Backend": Enum, "DeviceCapability": DC,
                 "GiB_bytes": GiB}
    namespace.update(stubs)
    exec(compile(module, "<vllm source>", "exec"), namespace)  # noqa: S102 - the release's own pure code
    return namespace


def run(release, rel, where, fn, *args, **kwargs):
    """Call a cut-out function; any error in it (a name or attribute no stub knows) is a ShapeError."""
    params = inspect.signature(fn).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    try:
        return fn(*args, **kwargs)
    except ShapeError:
        raise
    except Exception as error:  # noqa: BLE001 - reported with the release, file and function
        release.fail(rel, where, "code that runs with the stubs this module gives (it raised %s: %s): new logic"
                     % (type(error).__name__, error))


def env_default(release, name):
    """The value of envs.py's environment_variables[name] with nothing set in the environment ("absent": the
    release has no such variable)."""
    rel = "envs.py"
    for node in ast.walk(release.tree(rel)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == name:
                    if not isinstance(value, ast.Lambda):
                        release.fail(rel, "environment_variables[%r]" % name, "a lambda")
                    # The lambda may call envs.py's own helpers (maybe_convert_bool, ...): they come along.
                    helpers = [n for n in release.tree(rel).body if isinstance(n, ast.FunctionDef)]
                    namespace = compile_nodes(helpers, {"os": Strict("os", environ={}, getenv=lambda k, d=None: d,
                                                                     path=os.path)})
                    getter = eval(compile(ast.Expression(value), rel, "eval"), namespace)  # noqa: S307
                    return run(release, rel, "environment_variables[%r]" % name, getter)
    return "absent"


# ----------------------------------------------------------------------------------------------- the serve parser
class ConfigIndex:
    """Dataclass fields and type aliases of config/*.py, engine/arg_utils.py and the frontend module: what
    EngineArgs._compute_kwargs turns into argparse arguments."""

    def __init__(self, release, rels):
        self.release, self.classes, self.aliases = release, {}, {}
        for rel in rels:
            for node in release.tree(rel).body:
                if isinstance(node, ast.ClassDef):
                    fields = {st.target.id: st.annotation for st in node.body
                              if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}
                    decorators = [unparse(d) for d in node.decorator_list]
                    self.classes.setdefault(node.name, ([unparse(b) for b in node.bases], fields, decorators))
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    self.aliases.setdefault(node.targets[0].id, node.value)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                        and unparse(node.annotation) in ("TypeAlias", "typing.TypeAlias"):
                    self.aliases.setdefault(node.target.id, node.value)
                elif isinstance(node, getattr(ast, "TypeAlias", ())):
                    self.aliases.setdefault(node.name.id, node.value)

    def fields(self, cls):
        """Field -> annotation, base classes' first (dataclass order); None: unknown class."""
        if cls not in self.classes:
            return None
        bases, fields, _node = self.classes[cls]
        out = {}
        for base in bases:
            out.update(self.fields(base) or {})
        out.update(fields)
        return out

    def is_config(self, name):
        entry = self.classes.get(name)
        return bool(entry and any("config" in d or "dataclass" in d for d in entry[2]))

    def names(self, node, depth=0):
        """Every Name in an annotation, aliases and string annotations expanded."""
        out = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                out.add(n.id)
                if n.id in self.aliases and depth < 5 and n.id not in ("bool", "str", "int", "float"):
                    out |= self.names(self.aliases[n.id], depth + 1)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n is node:
                out |= self.names(ast.parse(n.value, mode="eval"), depth + 1)
        return out

    def literal_values(self, node, depth=0):
        """The Literal[...] values of an annotation, through aliases (None: no Literal)."""
        values = None
        inside = {id(x) for n in ast.walk(node) if isinstance(n, ast.Subscript) and unparse(n.value).endswith(
            "Literal") for x in ast.walk(n.slice)}
        for n in ast.walk(node):
            if isinstance(n, ast.Subscript) and unparse(n.value).endswith("Literal"):
                for e in (n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]):
                    if isinstance(e, ast.Constant):
                        values = (values or []) + [e.value]
                    elif isinstance(e, ast.Name) and e.id in self.aliases and depth < 5:
                        values = (values or []) + (self.literal_values(self.aliases[e.id], depth + 1) or [])
                    else:
                        self.release.fail("config/*.py", unparse(n), "Literal members that are constants or aliases")
            elif isinstance(n, ast.Name) and n.id in self.aliases and depth < 5 and id(n) not in inside:
                sub = self.literal_values(self.aliases[n.id], depth + 1)
                if sub is not None:
                    values = (values or []) + sub
        return values

    def kind(self, annotation, bool_str_branch):
        """(argparse kind, Literal values) as _compute_kwargs derives them from a field's annotation."""
        names = self.names(annotation)
        if any(self.is_config(n) for n in names) and not {"bool", "int", "float"} & names:
            return "json", None
        if bool_str_branch and names >= {"bool", "str", "None"} and \
                not names - {"bool", "str", "None", "Optional", "Union"}:
            return "optional-str", None
        if "bool" in names:
            return "BooleanOptionalAction", None
        values = self.literal_values(annotation)
        if values is not None:
            # literal_to_kwargs: a metavar, not choices, when the hint also takes str (any string parses)
            return ("metavar" if "str" in names else "choices"), values
        return "value", None


def _kwargs_sources(fn):
    """In an add_cli_args body: `x_kwargs = get_kwargs(Cls)` -> (Cls, None) or get_kwargs(Cls)[field] ->
    (Cls, field); `x_kwargs["f"]["k"] = v` overrides; names bound by `for a in ("--x", ...)` loops."""
    kwvars, overrides, bindings = {}, {}, {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call) and unparse(value.func) == "get_kwargs":
                kwvars[target.id] = (unparse(value.args[0]), None)
            elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript) and \
                    isinstance(value.value, ast.Call) and unparse(value.value.func) == "get_kwargs":
                kwvars[target.id] = (unparse(value.value.args[0]), value.slice.value)
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Subscript) and \
                    isinstance(target.value.value, ast.Name) and isinstance(target.slice, ast.Constant):
                overrides.setdefault((target.value.value.id, target.value.slice.value), {})[target.slice.value] = \
                    value
        if isinstance(node, ast.For) and isinstance(node.iter, (ast.List, ast.Tuple)):
            names = [e.id for e in node.target.elts] if isinstance(node.target, ast.Tuple) else [node.target.id]
            for i, name in enumerate(names):
                items = [e.elts[i] if isinstance(e, ast.Tuple) else e for e in node.iter.elts]
                bindings[name] = [e.value for e in items if isinstance(e, ast.Constant)]
    return kwvars, overrides, bindings


def _arguments(release, rel, where, fn, index, bool_str_branch):
    """[{opts, kind, choices}] for each .add_argument(...) call in fn."""
    kwvars, overrides, bindings = _kwargs_sources(fn)
    out = []
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and
                call.func.attr == "add_argument"):
            continue
        opts = []
        for arg in call.args:
            if isinstance(arg, ast.Constant):
                opts.append(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in bindings:
                opts.extend(bindings[arg.id])
        source, explicit = None, {}
        for kw in call.keywords:
            if kw.arg is not None:
                explicit[kw.arg] = kw.value
                continue
            splats = [kw.value] if not isinstance(kw.value, ast.Dict) else \
                [v for k, v in zip(kw.value.keys, kw.value.values) if k is None]
            if isinstance(kw.value, ast.Dict):
                explicit.update({k.value: v for k, v in zip(kw.value.keys, kw.value.values) if k is not None})
            for splat in splats:
                if isinstance(splat, ast.Subscript) and isinstance(splat.value, ast.Name) and splat.value.id in kwvars:
                    source = (splat.value.id, kwvars[splat.value.id][0], splat.slice.value)
                elif isinstance(splat, ast.Name) and splat.id in kwvars:
                    source = (splat.id,) + kwvars[splat.id]
        record = {"opts": opts, "kind": "value", "choices": None, "explicit_choices": None}
        if source:
            var, cls, field = source
            fields = index.fields(cls) or {}
            if field not in fields:
                release.fail(rel, where, "field %s.%s (splatted into add_argument(%s)) in config/*.py"
                             % (cls, field, ", ".join(opts)))
            record["kind"], record["choices"] = index.kind(fields[field], bool_str_branch)
            for key, value in overrides.get((var, field), {}).items():
                explicit.setdefault(key, value)
        if "action" in explicit:
            record["kind"] = unparse(explicit["action"]).strip("'\"").replace("argparse.", "")
        if "choices" in explicit:
            record["kind"], record["choices"], record["explicit_choices"] = "choices", None, explicit["choices"]
        out.append(record)
    return out


def serve_parser(release):
    """Option string -> argument record of `vllm serve` (make_arg_parser -> FrontendArgs + AsyncEngineArgs +
    EngineArgs add_cli_args), rebuilt statically."""
    serve = "entrypoints/cli/serve.py"
    module = next((n.module for n in ast.walk(release.tree(serve)) if isinstance(n, ast.ImportFrom)
                   and any(a.name == "make_arg_parser" for a in n.names)), None)
    front = module_rel(release, module) if module else None
    if front is None:
        release.fail(serve, "(imports)", "`from vllm.<module> import make_arg_parser`")
    arg_utils = "engine/arg_utils.py"
    configs = sorted("config/" + f for f in os.listdir(os.path.join(release.root, "vllm", "config"))
                     if f.endswith(".py"))
    index = ConfigIndex(release, configs + [arg_utils, front])
    compute = release.function(arg_utils, "_compute_kwargs")
    bool_str_branch = "type(None)}" in unparse(compute).replace(" ", "")
    records = []
    for rel, qualname in ((arg_utils, "EngineArgs.add_cli_args"), (arg_utils, "AsyncEngineArgs.add_cli_args"),
                          (front, "make_arg_parser")):
        records += _arguments(release, rel, qualname, release.function(rel, qualname), index, bool_str_branch)
    records += _frontend_fields(release, front, index, bool_str_branch)
    parser = {}
    for record in records:
        for opt in record["opts"]:
            parser.setdefault(opt, record)
    return parser


def _frontend_fields(release, rel, index, bool_str_branch):
    """FrontendArgs: one --<field> per dataclass field, with action overrides set in add_cli_args or
    _customize_cli_kwargs (frontend_kwargs["field"]["action"] = ...)."""
    fields = index.fields("FrontendArgs")
    if fields is None:
        release.fail(rel, "FrontendArgs", "the FrontendArgs dataclass")
    actions = {}
    for cls in ("FrontendArgs", "BaseFrontendArgs"):
        for name in ("add_cli_args", "_customize_cli_kwargs"):
            fn = release.function(rel, "%s.%s" % (cls, name), required=False) if release.cls(
                rel, cls, required=False) else None
            for node in ast.walk(fn) if fn else ():
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
                    target = node.targets[0]
                    if isinstance(target.value, ast.Subscript) and isinstance(target.slice, ast.Constant) and \
                            target.slice.value == "action":
                        actions[target.value.slice.value] = unparse(node.value).replace("argparse.", "").strip("'\"")
    out = []
    for field, annotation in fields.items():
        kind, values = index.kind(annotation, bool_str_branch)
        out.append({"opts": ["--" + field.replace("_", "-")], "kind": actions.get(field, kind), "choices": values,
                    "explicit_choices": None})
    return out


def boolean_action(release):
    """The argparse action class BooleanOptionalAction arguments get: FlexibleArgumentParser.__init__ may register
    its own (EnableDisableAction, 0.33+), run from the source."""
    import argparse
    rel = release.first(["utils/argparse_utils.py", "utils/__init__.py"])
    init = release.function(rel, "FlexibleArgumentParser.__init__")
    registered = [c for c in ast.walk(init) if isinstance(c, ast.Call) and unparse(c.func) == "self.register"]
    if not registered:
        return argparse.BooleanOptionalAction
    call = registered[0]
    if len(registered) > 1 or [unparse(a) for a in call.args[:2]] != ["'action'", "BooleanOptionalAction"]:
        release.fail(rel, "FlexibleArgumentParser.__init__", 'one self.register("action", BooleanOptionalAction, X)')
    name = unparse(call.args[2])
    node = release.cls(rel, name)
    namespace = compile_nodes([node], {"BooleanOptionalAction": argparse.BooleanOptionalAction})
    return namespace[name]


def off_spelling(release, action_cls, opts):
    """The one visible option string that sets a boolean argument to False (None: none)."""
    action = action_cls(list(opts), "dest")
    visible = getattr(action, "visible_option_strings", action.option_strings)
    negative = getattr(action, "negative_option_strings", None)
    if negative is None:
        negative = [o for o in action.option_strings if o not in opts]
    off = [o for o in visible if o in negative]
    if len(off) != 1:
        release.fail("utils/argparse_utils.py", action_cls.__name__, "one visible negative option for %s, got %s"
                     % (opts[0], off))
    return off[0]


def read_flags(path):
    """FLAGS of plugins/plugin_utils/vllm_sizing/flags.py as {key: {"flag": ..., "kind": ...}} (read with ast: importing
    the package needs Ansible)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    table = next((n.value for n in tree.body if isinstance(n, ast.Assign) and unparse(n.targets[0]) == "FLAGS"), None)
    if not isinstance(table, ast.Dict):
        raise ShapeError("%s: expected a module-level FLAGS = {...} dict" % path)
    flags = {}
    for key, spec in zip(table.keys, table.values):
        fields = {k.value: v for k, v in zip(spec.keys, spec.values)}
        flags[key.value] = {"flag": fields["flag"].value, "kind": fields["kind"].value}
    return flags


def flag_facts(release, flags):
    """absent_flags, negative_flags, choices, and what --kv-cache-dtype and --block-size take."""
    parser = serve_parser(release)
    action_cls = boolean_action(release)
    negative, choices = {}, {}
    for key, spec in sorted(flags.items()):
        record = parser.get(spec["flag"])
        if record is None:
            continue
        if spec["kind"] == "bool":
            if record["kind"] == "BooleanOptionalAction":
                negative[key] = off_spelling(release, action_cls, record["opts"])
            elif record["kind"] != "store_true":
                release.fail("engine/arg_utils.py", "add_argument(%s)" % spec["flag"],
                             "a boolean (BooleanOptionalAction or store_true), got %s" % record["kind"])
        if record["kind"] == "choices":
            choices[key] = sorted(_choices(release, spec["flag"], record))
    kv, block = (_required(release, parser, flag) for flag in ("--kv-cache-dtype", "--block-size"))
    if kv["kind"] not in ("choices", "metavar") or not kv["choices"]:
        release.fail("config/cache.py", "CacheConfig.cache_dtype", "a CacheDType Literal (choices or metavar)")
    if block["kind"] not in ("choices", "value"):
        release.fail("config/cache.py", "CacheConfig.block_size", "a BlockSize Literal or an int")
    return {
        "absent_flags": sorted(k for k, spec in flags.items() if spec["flag"] not in parser),
        "negative_flags": negative, "choices": choices,
        "kv_cache_dtypes": list(kv["choices"]), "kv_cache_dtype_parse": "choices" if kv["kind"] == "choices" else "any",
        "block_sizes": sorted(block["choices"]) if block["kind"] == "choices" else None,
    }


def _required(release, parser, flag):
    if flag not in parser:
        release.fail("engine/arg_utils.py", "EngineArgs.add_cli_args", "an argument %s" % flag)
    return parser[flag]


def _choices(release, flag, record):
    """A choices argument's values: its Literal, a literal list, or a parser registry (0.11.0 --reasoning-parser:
    list(ReasoningParserManager.reasoning_parsers), the names its @register_module decorators give)."""
    if record["explicit_choices"] is None:
        return record["choices"]
    expr = record["explicit_choices"]
    try:
        return list(literal(expr))
    except ValueError:
        pass
    if unparse(expr) != "list(ReasoningParserManager.reasoning_parsers)":
        release.fail("engine/arg_utils.py", "add_argument(%s)" % flag, "choices as a literal list or "
                     "list(ReasoningParserManager.reasoning_parsers), got %s" % unparse(expr))
    names = []
    for name in sorted(os.listdir(os.path.join(release.root, "vllm", "reasoning"))):
        if not name.endswith(".py"):
            continue
        for node in ast.walk(release.tree("reasoning/" + name)):
            for deco in getattr(node, "decorator_list", ()):
                if isinstance(deco, ast.Call) and unparse(deco.func) == "ReasoningParserManager.register_module":
                    if len(deco.args) != 1:
                        release.fail("reasoning/" + name, "@ReasoningParserManager.register_module", "one name")
                    value = literal(deco.args[0])
                    names += [value] if isinstance(value, str) else list(value)
    return names


# ----------------------------------------------------------------------------------------------- cache and check
CACHE = "config/cache.py"
CHECK_RELS = ("v1/core/kv_cache_planning.py", "v1/core/kv_cache_utils.py")


def field_default(release, rel, cls, name):
    """A dataclass field's default (`= x` or `= Field(default=x)`); "absent" when the class has no such field."""
    node = release.class_field(rel, cls, name)
    if node is None:
        return "absent"
    value = node.value
    if isinstance(value, ast.Call) and unparse(value.func).endswith("Field"):
        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
    try:
        return literal(value)
    except ValueError:
        release.fail(rel, "%s.%s" % (cls, name), "a literal default, got %s" % unparse(value))


def defaults(release):
    """utilization and extensible_kv_cache: CacheConfig's defaults (0.34: None, resolved to 1.0 with the
    extensible KV cache, else DEFAULT_GPU_MEMORY_UTILIZATION)."""
    utilization = field_default(release, CACHE, "CacheConfig", "gpu_memory_utilization")
    if utilization is None:
        utilization = field_default(release, CACHE, "CacheConfig", "DEFAULT_GPU_MEMORY_UTILIZATION")
    if not isinstance(utilization, float):
        release.fail(CACHE, "CacheConfig.gpu_memory_utilization", "a float default (or None and "
                     "DEFAULT_GPU_MEMORY_UTILIZATION)")
    extensible = field_default(release, CACHE, "CacheConfig", "enable_extensible_kv_cache")
    if extensible is None and "enable_extensible_kv_cache" not in release.text("config/vllm.py"):
        release.fail("config/vllm.py", "VllmConfig", "enable_extensible_kv_cache=None resolved here")
    if extensible not in ("absent", None, True, False):
        release.fail(CACHE, "CacheConfig.enable_extensible_kv_cache", "a bool or None default")
    return {"utilization": utilization, "extensible_kv_cache": extensible in (None, True)}


def message(release):
    """message and gib_format: the startup error's "models's"/"model's" and how it prints GiB."""
    for name in ("_check_enough_kv_cache_memory", "check_enough_kv_cache_memory"):
        rel = next((r for r in CHECK_RELS if release.has(r) and release.function(r, name, required=False)), None)
        if rel is None:
            continue
        fn = release.function(rel, name)
        texts = [render(n.exc.args[0]) for n in ast.walk(fn) if isinstance(n, ast.Raise) and
                 isinstance(n.exc, ast.Call) and n.exc.args]
        text = next((t for t in texts if "To serve at least one request" in t), None)
        if text is None:
            continue
        word = re.search(r"with the (\w+'s) max seq len", text)
        if not word:
            release.fail(rel, name, "\"... with the model's max seq len ...\" in the error")
        if re.search(r"\{needed_memory / GiB_bytes:\.2f\}", text):
            return {"message": word.group(1), "gib_format": "%.2f"}
        if "{format_gib(needed_memory)}" in text:
            check_format_gib(release)
            return {"message": word.group(1), "gib_format": None}
        release.fail(rel, name, "GiB printed as {x / GiB_bytes:.2f} or {format_gib(x)}, got %r" % text)
    release.fail(CHECK_RELS[1], "check_enough_kv_cache_memory", "the \"To serve at least one request\" error")


def render(node):
    """The text of a string expression, {expr:spec} for its placeholders."""
    if isinstance(node, ast.BinOp):
        return render(node.left) + render(node.right)
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                out += str(part.value)
            else:
                spec = "".join(str(x.value) for x in part.format_spec.values if isinstance(x, ast.Constant)) \
                    if part.format_spec else ""
                out += "{%s%s}" % (unparse(part.value), ":" + spec if spec else "")
        return out
    return "{%s}" % unparse(node)


def check_format_gib(release):
    """format_gib must print round(x / GiB, 2) with str() (what gib_format null means)."""
    rel = "utils/mem_utils.py"
    fn = compile_nodes([release.function(rel, "format_gib")], {})["format_gib"]
    for value, text in ((1.5 * GiB, "1.5"), (1.23456 * GiB, "1.23"), (2 * GiB, "2.0")):
        if run(release, rel, "format_gib", fn, int(value)) != text:
            release.fail(rel, "format_gib", "str(round(x / GiB, 2)) (format_gib(%d) == %r)" % (value, text))


def check(release):
    """check and null_block: what the KV startup check sums, and whether one pool block is held back first."""
    rel = next((r for r in CHECK_RELS if release.has(r) and
                release.function(r, "get_kv_cache_configs", required=False)), None)
    if rel is None:
        release.fail(CHECK_RELS[1], "get_kv_cache_configs", "the function that runs the startup check")
    fn = release.function(rel, "get_kv_cache_configs")
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and
             unparse(c.func) in ("check_enough_kv_cache_memory", "_check_enough_kv_cache_memory")]
    if len(calls) != 1:
        release.fail(rel, "get_kv_cache_configs", "one call of (_)check_enough_kv_cache_memory")
    call = calls[0]
    if unparse(call.func) == "check_enough_kv_cache_memory":
        kind = _layers_check(release, rel)
    else:
        memory, needed = unparse(call.args[0]), unparse(call.args[1])
        whole = memory == "min(available_memory)" and "global_kv_cache_groups" in needed
        if not whole and not (isinstance(call.args[0], ast.Name) and "_max_memory_usage_bytes_from_groups" in needed
                              and "global_kv_cache_groups" not in needed):
            release.fail(rel, "get_kv_cache_configs", "the check on min(available_memory) with the whole model's "
                         "groups, or on each worker's memory with its groups, got (%s, %s)" % (memory, needed))
        summed = _groups_sum(release, rel)
        if whole and summed:
            release.fail(rel, "_max_memory_usage_bytes_from_groups", "the first group's blocks (whole-model check)")
        kind = "groups" if summed else "first-group-global" if whole else "first-group"
    return {"check": kind, "null_block": _null_block(release, rel, fn)}


def _layers_check(release, rel):
    """0.11-0.13: the check sums max_memory_usage_bytes over one worker's layers."""
    fn = release.function(rel, "check_enough_kv_cache_memory")
    needed = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and unparse(n.targets[0]) == "needed_memory"]
    if len(needed) != 1 or not unparse(needed[0]).startswith("max_memory_usage_bytes(vllm_config, "):
        release.fail(rel, "check_enough_kv_cache_memory", "needed_memory = max_memory_usage_bytes(vllm_config, ...)")
    return "layers"


def _groups_sum(release, rel):
    """Whether _max_memory_usage_bytes_from_groups sums blocks over the groups (False: the first group's only)."""
    where = "_max_memory_usage_bytes_from_groups"
    fn = release.function(rel, where)
    final = fn.body[-1]
    if not (isinstance(final, ast.Return) and isinstance(final.value, ast.BinOp)):
        release.fail(rel, where, "a final `return <bytes> * <blocks>`")
    blocks = [n.id for n in ast.walk(final.value) if isinstance(n, ast.Name) and "block" in n.id and
              "bytes_per_block" not in n.id]
    if len(blocks) != 1:
        release.fail(rel, where, "one blocks variable in the final return, got %s" % blocks)
    summed = first = False
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and unparse(node.targets[0]) == blocks[0]:
            text = unparse(node.value)
            summed |= text.startswith("sum(") and "for group in kv_cache_groups" in text
            first |= text.startswith("cdiv(") and ("kv_cache_groups[0]" in text or "any_spec" in text)
        if isinstance(node, ast.For) and unparse(node.iter) == "kv_cache_groups":
            summed |= any(isinstance(n, ast.AugAssign) and unparse(n.target) == blocks[0] for n in ast.walk(node))
    if summed == first:
        release.fail(rel, where, "%s summed over kv_cache_groups or taken from kv_cache_groups[0]" % blocks[0])
    return summed


def _null_block(release, rel, fn):
    subtractions = [n for n in ast.walk(fn) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub)
                    and "block" in unparse(n.right)]
    if not subtractions:
        return False
    if not all(isinstance(n.right, ast.Call) and unparse(n.right.func).startswith("_pool_bytes_per_block")
               for n in subtractions):
        release.fail(rel, "get_kv_cache_configs", "the null block as `avail_mem - _pool_bytes_per_block...(...)`")
    return True


def in_flight(release):
    """What a sliding-window layer keeps beyond its window: batch, batches-runner or batches (see the schema)."""
    rel = "v1/kv_cache_interface.py"
    fn = release.function(rel, "SlidingWindowSpec.max_admission_blocks_per_request", required=False) or \
        release.function(rel, "SlidingWindowSpec.max_memory_usage_bytes")
    where = "SlidingWindowSpec.%s" % fn.name
    tokens = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and unparse(n.targets[0]) == "num_tokens"]
    if len(tokens) != 1:
        release.fail(rel, where, "num_tokens = min(self.sliding_window - 1 + <in flight>, max_model_len)")
    text = unparse(tokens[0]).replace("self.extra_retained_tokens + ", "")
    if text == "min(self.sliding_window - 1 + max_num_batched_tokens, max_model_len)":
        if "max_num_batched_tokens = vllm_config.scheduler_config.max_num_batched_tokens" not in unparse(
                release.function(rel, "SlidingWindowSpec.max_memory_usage_bytes")):
            release.fail(rel, "SlidingWindowSpec.max_memory_usage_bytes", "max_num_batched_tokens from the "
                         "scheduler config")
        return "batch"
    if text != "min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)":
        release.fail(rel, where, "num_tokens = min(self.sliding_window - 1 + max_num_batched_tokens or "
                     "max_in_flight_tokens, max_model_len), got %s" % text)
    return _concurrent_batches(release)


def _concurrent_batches(release):
    """VllmConfig.max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens, with
    max_concurrent_batches run for async on/off, V1/V2 runner and pp 1-3."""
    rel = "config/vllm.py"
    tokens = release.function(rel, "VllmConfig.max_in_flight_tokens")
    if unparse(tokens.body[-1]) != "return self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens":
        release.fail(rel, "VllmConfig.max_in_flight_tokens", "max_concurrent_batches * max_num_batched_tokens")
    fn = compile_nodes([release.function(rel, "VllmConfig.max_concurrent_batches")], {})["max_concurrent_batches"]
    rules = {"batches-runner": lambda a, v2, pp: (pp + 1 if v2 else 2 if pp <= 1 else pp) if a else pp,
             "batches": lambda a, v2, pp: pp + 1 if a else pp}
    cases = [(a, v2, pp) for a in (False, True) for v2 in (False, True) for pp in (1, 2, 3)]
    got = [run(release, rel, "VllmConfig.max_concurrent_batches", fn, Strict(
        "VllmConfig", scheduler_config=Strict("scheduler_config", async_scheduling=a), use_v2_model_runner=v2,
        parallel_config=Strict("parallel_config", pipeline_parallel_size=pp))) for a, v2, pp in cases]
    match = [name for name, rule in rules.items() if got == [rule(*case) for case in cases]]
    if not match:
        release.fail(rel, "VllmConfig.max_concurrent_batches", "one of the known rules (%s)" % ", ".join(rules))
    return match[0]


# Where the sliding-window KV spec is built: Attention.get_kv_cache_spec (0.16+ in model_executor/layers/attention/
# attention.py, before in attention/layer.py); 0.11.0 builds it in the V1 runner's get_kv_cache_spec.
ATTENTION_LAYER = ("model_executor/layers/attention/attention.py", "attention/layer.py")


def _sw_bases(items):
    """Kernel sizes as candidates: the int sizes, else the MultipleOf bases."""
    ints = [s for s in items if not isinstance(s, MultipleOf)]
    return ints or [s.base for s in items if isinstance(s, MultipleOf)]


def _sw_expanded(items, max_block):
    """The int sizes plus each MultipleOf expanded to its largest multiple within max_block (at least its base)."""
    return [s for s in items if not isinstance(s, MultipleOf)] + \
        [max(s.base, max_block // s.base * s.base) for s in items if isinstance(s, MultipleOf)]


def _sw_fit(candidates, per_token, budget):
    """The largest candidate whose page fits in budget, else the smallest."""
    fitting = [b for b in candidates if b * per_token <= budget]
    return max(fitting) if fitting else min(candidates)


def _sw_primary(items, per_token, block, shared):
    return block


def _sw_smallest(items, per_token, block, shared):
    candidates = _sw_bases(items)
    if not candidates:
        return block
    return _sw_fit(candidates, per_token, shared) if shared else min(candidates)


def _sw_largest_within(items, per_token, block, shared):
    candidates = _sw_bases(items)
    return _sw_fit(candidates, per_token, shared or per_token * block) if candidates else block


def _sw_largest_within_expanded(items, per_token, block, shared):
    budget = shared or per_token * block
    candidates = _sw_expanded(items, budget // per_token)
    return _sw_fit(candidates, per_token, budget) if candidates else block


def _sw_dividing(items, per_token, block, shared):
    budget = shared or per_token * block
    max_block = budget // per_token
    candidates = _sw_expanded(items, max_block)
    if not candidates:
        return block
    if not shared:
        dividing = [b for b in candidates if b * per_token <= budget and block % b == 0]
        dividing += [b for s in items if isinstance(s, MultipleOf) for b in range(s.base, max_block + 1, s.base)
                     if block % b == 0]
        if dividing:
            return max(dividing)
    return _sw_fit(candidates, per_token, budget)


# sw_block: the KV block size a sliding-window layer's spec gets, as a function of the backend's kernel sizes
# (items of get_supported_kernel_block_sizes), the spec's bytes per token, the primary block size and
# cache_config.skip_page_size_padded (the shared page of a skip-quant padded spec, None otherwise).
#   primary (0.11-0.24): cache_config.block_size.
#   smallest (0.25-0.29): _largest_kernel_block_within with page_budget = the shared page; without one, the
#     smallest kernel size (int sizes, else MultipleOf bases).
#   largest-within: page_budget = shared page or per_token x block_size; the largest of those candidates that
#     fits, else the smallest (a rule no cached release has; kept for a release that does).
#   largest-within-expanded (0.30-0.33): the same with the int sizes plus each MultipleOf expanded to its largest
#     multiple within the budget.
#   dividing (0.34): without a shared page, the largest fitting candidate (or multiple of a MultipleOf base up to
#     the budget) that divides block_size; else as largest-within-expanded.
SW_RULES = {"primary": _sw_primary, "smallest": _sw_smallest, "largest-within": _sw_largest_within,
            "largest-within-expanded": _sw_largest_within_expanded, "dividing": _sw_dividing}
# Probes (kernel size items, bytes per token, primary block, shared page) that tell the rules apart.
SW_PROBES = [(items, per_token, block, shared)
             for items in ([16], [64], [16, 32, 64], [32, 64], [MultipleOf(1)], [MultipleOf(16)], [MultipleOf(32)],
                           [16, MultipleOf(32)], [])
             for per_token in (1024, 1000)
             for block in (16, 32, 48, 64, 128, 256)
             for shared in (None, 16 * 1024, 50000, 300000)]


def sw_block(release):
    """sw_block: the rule of SW_RULES that Attention.get_kv_cache_spec follows for a sliding-window layer, found
    by running it (and the helpers of its module it calls, such as _largest_kernel_block_within) on SW_PROBES with
    stub backends and configs; 0.11.0 (no Attention.get_kv_cache_spec) from the V1 runner's get_kv_cache_spec."""
    rel = release.first(ATTENTION_LAYER)
    fn = release.function(rel, "Attention.get_kv_cache_spec", required=False) if rel else None
    runner_builds = release.has(V1_RUNNER) and "SlidingWindowSpec(" in unparse(
        release.function(V1_RUNNER, "GPUModelRunner.get_kv_cache_spec", required=False))
    if fn is None:
        if not runner_builds:
            release.fail(ATTENTION_LAYER[0], "Attention.get_kv_cache_spec", "the method that builds the sliding-"
                         "window KV spec (or, as in 0.11.0, GPUModelRunner.get_kv_cache_spec building it)")
        return _runner_sw_block(release)
    if runner_builds:
        release.fail(V1_RUNNER, "GPUModelRunner.get_kv_cache_spec", "no SlidingWindowSpec of its own beside "
                     "Attention.get_kv_cache_spec in vllm/%s" % rel)
    where = "Attention.get_kv_cache_spec"
    if "skip_page_size_padded" in unparse(fn) and \
            field_default(release, CACHE, "CacheConfig", "skip_page_size_padded") is not None:
        release.fail(CACHE, "CacheConfig.skip_page_size_padded", "a None default (set only for skip-quant padding)")
    nodes, names = [fn], set()
    todo = [fn]
    while todo:  # module-level functions of rel the method calls, and theirs
        for name in sorted(_free_names(todo.pop()) - names):
            names.add(name)
            node = release.function(rel, name, required=False)
            if node is not None:
                nodes.append(node)
                todo.append(node)
    case = {}

    class Spec:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

        @property
        def real_page_size_bytes(self):
            return self.block_size * case["per_token"]

    class FullSpec(Spec):
        pass
    attention_type = Strict("AttentionType", DECODER="decoder", ENCODER="encoder", ENCODER_ONLY="encoder_only",
                            ENCODER_DECODER="encoder_decoder")
    namespace = compile_nodes(nodes, {"SlidingWindowSpec": Spec, "FullAttentionSpec": FullSpec,
                                      "AttentionType": attention_type, "MultipleOf": MultipleOf,
                                      "get_kv_quant_mode": lambda dtype: "none"})
    method = namespace["get_kv_cache_spec"]
    got = []
    for items, per_token, block, shared in SW_PROBES:
        case["per_token"] = per_token
        backend = Strict("attn_backend", get_supported_kernel_block_sizes=lambda spec=None, items=items: list(items),
                         customize_spec=lambda spec: spec, is_mla=lambda: False)
        layer = Strict("Attention", attn_type="decoder", sliding_window=4096, num_kv_heads=8, head_size=128,
                       head_size_v=128, kv_cache_dtype="auto", kv_cache_torch_dtype="bfloat16", attn_backend=backend)
        config = Strict("vllm_config", cache_config=Strict("cache_config", block_size=block,
                                                           skip_page_size_padded=shared),
                        model_config=Strict("model_config", use_mla=False))
        spec = run(release, rel, where, method, layer, config)
        # Exactly SlidingWindowSpec: FullAttentionSpec, a subclass of it here, is the wrong answer.
        exact = type(spec) is Spec  # pylint: disable=unidiomatic-typecheck
        if not exact or not isinstance(getattr(spec, "block_size", None), int):
            release.fail(rel, where, "a SlidingWindowSpec with an int block_size for a sliding-window layer, got %r"
                         % (spec,))
        got.append(spec.block_size)
    match = [name for name, rule in SW_RULES.items() if got == [rule(*probe) for probe in SW_PROBES]]
    if len(match) != 1:
        release.fail(rel, where, "the sliding-window block size chosen by one of the known rules (%s; see SW_RULES)"
                     % ", ".join(SW_RULES))
    return match[0]


def _runner_sw_block(release):
    """0.11.0: GPUModelRunner.get_kv_cache_spec builds SlidingWindowSpec(block_size=block_size, ...) with
    block_size = self.vllm_config.cache_config.block_size (primary)."""
    where = "GPUModelRunner.get_kv_cache_spec"
    fn = release.function(V1_RUNNER, where)
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and unparse(c.func) == "SlidingWindowSpec"]
    blocks = [unparse(kw.value) for c in calls for kw in c.keywords if kw.arg == "block_size"]
    assigned = [unparse(n.value) for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                and "block_size" in [unparse(t) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]]
    if not calls or len(blocks) != len(calls) or set(blocks) != {"block_size"} or \
            assigned != ["self.vllm_config.cache_config.block_size"]:
        release.fail(V1_RUNNER, where, "SlidingWindowSpec(block_size=block_size, ...) with one `block_size = "
                     "self.vllm_config.cache_config.block_size`")
    return "primary"


# ----------------------------------------------------------------------------------------------- defaults
def async_scheduling(release):
    """{"default", "off_with_pp"}: SchedulerConfig's default and, when it is None, the chain in VllmConfig that
    resolves it (the else branch: on; PP > 1 turns it off always, with the V1 runner, or never)."""
    rel = "config/vllm.py"
    default = field_default(release, "config/scheduler.py", "SchedulerConfig", "async_scheduling")
    if default is False:
        return {"default": False, "off_with_pp": "never"}
    if default is not None:
        release.fail("config/scheduler.py", "SchedulerConfig.async_scheduling", "a False or None default")
    chains = [n for n in ast.walk(release.tree(rel)) if isinstance(n, ast.If) and
              unparse(n.test) == "self.scheduler_config.async_scheduling is None"]
    if len(chains) != 1:
        release.fail(rel, "VllmConfig.__post_init__", "one `if self.scheduler_config.async_scheduling is None:`")
    branches, node = [], chains[0].body[-1] if len(chains[0].body) == 1 else None
    while isinstance(node, ast.If):
        branches.append((node.test, _assigned_async(release, node.body)))
        node = node.orelse[0] if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) else node.orelse
    if not branches or _assigned_async(release, node or []) is not True or \
            any(value is not False for _test, value in branches):
        release.fail(rel, "VllmConfig.__post_init__", "an if/elif chain setting async_scheduling False, ending in "
                     "an else setting it True")
    off = {_pp_rule(release, rel, test) for test, _value in branches} - {None}
    if len(off) > 1:
        release.fail(rel, "VllmConfig.__post_init__", "one pipeline-parallel condition, got %s" % sorted(off))
    return {"default": True, "off_with_pp": off.pop() if off else "never"}


def _assigned_async(release, body):
    values = [n.value for st in body for n in ast.walk(st) if isinstance(n, ast.Assign)
              and unparse(n.targets[0]) == "self.scheduler_config.async_scheduling"]
    return literal(values[-1]) if values else None


def _pp_rule(release, rel, test):
    """always / v1-runner / None for one branch test (a variable it tests is read from its assignments)."""
    text = unparse(test)
    if text == "self.parallel_config.pipeline_parallel_size > 1":
        return "always"
    if text == "self.parallel_config.pipeline_parallel_size > 1 and (not self.use_v2_model_runner)":
        return "v1-runner"
    if "pipeline_parallel" in text:
        release.fail(rel, "VllmConfig.__post_init__", "a known pipeline-parallel condition, got %s" % text)
    # A variable the test reads (0.33: v1_async_sched_incompat) set under a pipeline-parallel condition.
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name) and n.id != "self"}
    tree = release.tree(rel)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    rules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "pipeline_parallel" in unparse(node.test) and names & {
                unparse(t) for st in node.body for n in ast.walk(st) if isinstance(n, ast.Assign) for t in n.targets}:
            outer = parents.get(id(node))
            while outer is not None and not (isinstance(outer, ast.If) and
                                             unparse(outer.test) == "not self.use_v2_model_runner"):
                outer = parents.get(id(outer))
            if outer is None or unparse(node.test) != "self.parallel_config.pipeline_parallel_size > 1":
                release.fail(rel, "VllmConfig.__post_init__", "a known pipeline-parallel condition behind %s, got %s"
                             % (sorted(names), unparse(node.test)))
            rules.add("v1-runner")
    return rules.pop() if rules else None


def batch_defaults(release):
    """batch_defaults and cpu_batch_defaults: the `vllm serve` (OPENAI_API_SERVER) tiers of EngineArgs'
    get_batch_defaults (0.11.0: _set_default_args), an if/elif chain on device memory."""
    rel = "engine/arg_utils.py"
    fn = release.function(rel, "EngineArgs.get_batch_defaults", required=False) or \
        release.function(rel, "EngineArgs._set_default_args")
    where = "EngineArgs." + fn.name
    gb10 = {unparse(n.targets[0]) for n in ast.walk(fn) if isinstance(n, ast.Assign)
            and unparse(n.value) == "current_platform.is_device_capability((12, 1))"}
    chain = next((n for n in fn.body if isinstance(n, ast.If) and "GiB_bytes" in unparse(n.test)), None)
    if chain is None:
        chain = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and "GiB_bytes" in unparse(n.test)), None)
    tiers, node = [], chain
    while node is not None:
        test = node.test if isinstance(node, ast.If) else None
        body = node.body if isinstance(node, ast.If) else node
        tiers.append(_tier(release, rel, where, test, body, gb10))
        if not isinstance(node, ast.If):
            break
        node = node.orelse[0] if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) else node.orelse
    if len(tiers) < 2 or tiers[-1][0] != 0:
        release.fail(rel, where, "an if/elif/else chain on `device_memory >= N * GiB_bytes`")
    cpu = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and unparse(n.test) == "current_platform.is_cpu()"),
               None)
    if cpu is None or "world_size = self.pipeline_parallel_size * self.tensor_parallel_size" not in unparse(
            release.cls(rel, "EngineArgs")):
        release.fail(rel, where, "CPU defaults `if current_platform.is_cpu():` scaled by world_size = pp x tp")
    values = _api_values(release, rel, where, cpu.body, {"world_size": 1})
    return {"batch_defaults": tiers, "cpu_batch_defaults": [values["tokens"], values["seqs"]]}


def _tier(release, rel, where, test, body, gb10):
    """[min_gib, excluded name substring, excluded cc, max_num_batched_tokens, max_num_seqs] of one branch."""
    terms = (test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]) if test else []
    gib, name, cc = 0, None, None
    for term in terms:
        text = unparse(term)
        memory = re.fullmatch(r"device_memory >= (\d+) \* GiB_bytes", text)
        excluded = re.fullmatch(r"'(\w+)' not in device_name", text)
        if memory:
            gib = int(memory.group(1))
        elif excluded:
            name = excluded.group(1)
        elif text in {"not %s" % g for g in gb10}:
            cc = "12.1"
        else:
            release.fail(rel, where, "tier conditions on device_memory, 'x' not in device_name or GB10, got %s" % text)
    values = _api_values(release, rel, where, body, {})
    return [gib, name, cc, values["tokens"], values["seqs"]]


def _api_values(release, rel, where, body, names):
    """The OPENAI_API_SERVER entries of the default_max_num_batched_tokens / default_max_num_seqs dicts."""
    out = {}
    for st in body:
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and isinstance(st.value, ast.Dict):
            target = unparse(st.targets[0] if isinstance(st, ast.Assign) else st.target)
            key = {"default_max_num_batched_tokens": "tokens", "default_max_num_seqs": "seqs"}.get(target)
            value = next((v for k, v in zip(st.value.keys, st.value.values)
                          if k is not None and unparse(k).endswith("OPENAI_API_SERVER")), None)
            if key and value is not None:
                out[key] = literal(value, names)
    if set(out) != {"tokens", "seqs"}:
        release.fail(rel, where, "default_max_num_batched_tokens and default_max_num_seqs dicts with an "
                     "OPENAI_API_SERVER entry in each branch")
    return out


# ----------------------------------------------------------------------------------------------- budget
WORKER = "v1/worker/gpu_worker.py"
V1_RUNNER = "v1/worker/gpu_model_runner.py"
V2_RUNNER = "v1/worker/gpu/model_runner.py"


def method(release, rel, name):
    """The first method called name of any class in rel (None: none)."""
    return next((n for n in ast.walk(release.tree(rel)) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def requested(release):
    """product (total x utilization, 0.11-0.13) or ceil (math.ceil of it, v1/worker/utils.py request_memory)."""
    rel = "v1/worker/utils.py"
    fn = release.function(rel, "request_memory", required=False) if release.has(rel) else None
    if fn is not None:
        if not re.search(r"math\.ceil\(\s*init_snapshot\.total_memory \*", unparse(fn)):
            release.fail(rel, "request_memory", "math.ceil(init_snapshot.total_memory * <utilization>)")
        return "ceil"
    if not re.search(r"self\.requested_memory = self\.init_snapshot\.total_memory \* self\.cache_config\."
                     r"gpu_memory_utilization", unparse(release.function(WORKER, "Worker.init_device"))):
        release.fail(WORKER, "Worker.init_device", "self.requested_memory = total_memory * gpu_memory_utilization "
                     "(or a request_memory function in v1/worker/utils.py)")
    return "product"


def sampler(release):
    """sampler (V1 runner) and sampler_v2 (V2 runner's dummy sampler run)."""
    rel = "v1/sample/ops/topk_topp_sampler.py"
    text = release.text(rel)
    env = env_default(release, "VLLM_USE_FLASHINFER_SAMPLER")
    truthy = re.search(r"if (not )?envs\.VLLM_USE_FLASHINFER_SAMPLER:", text)
    if "VLLM_USE_FLASHINFER_SAMPLER is not False" in text and env is None:
        flashinfer = "if-installed"
    elif truthy and env is True:
        flashinfer = "default"
    elif truthy and env in (None, False):
        flashinfer = "opt-in"
    else:
        release.fail(rel, "TopKTopPSampler", "VLLM_USE_FLASHINFER_SAMPLER read as `is not False` (default None) or "
                     "as a truth value (default None, False or True), got default %r" % (env,))
    top = unparse(release.function(rel, "apply_top_k_top_p"))
    native = "triton" if "apply_top_k_top_p_triton(" in top else "sort" if ".sort(" in top else None
    if native is None:
        release.fail(rel, "apply_top_k_top_p", "a call of apply_top_k_top_p_triton or a logits sort")
    v2 = None
    if release.has(V2_RUNNER):
        run_fn = method(release, V2_RUNNER, "_dummy_sampler_run")
        if run_fn is None:
            release.fail(V2_RUNNER, "_dummy_sampler_run", "the V2 runner's dummy sampler run")
        v2 = "warmup" if "for_sampler_warmup" in unparse(run_fn) else "plain"
    return {"sampler": {"flashinfer": flashinfer, "native": native}, "sampler_v2": v2}


def moe_chunk(release):
    value = env_default(release, "VLLM_FUSED_MOE_CHUNK_SIZE")
    if value == "absent":
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        release.fail("envs.py", "VLLM_FUSED_MOE_CHUNK_SIZE", "an int default, got %r" % (value,))
    return value


def non_torch(release):
    """snapshot / snapshot-graphs / consumed: how memory_profiling counts non-KV memory, and whether the V1
    runner's CUDA-graph profiling runs inside it."""
    rel = release.first(["utils/mem_utils.py", "utils/__init__.py"])
    fn = release.function(rel, "memory_profiling", required=False) if rel == "utils/mem_utils.py" else None
    fn = fn or release.function("utils/__init__.py", "memory_profiling")
    rel = rel if fn in release.tree(rel).body else "utils/__init__.py"
    values = [unparse(n.value) for n in ast.walk(fn) if isinstance(n, ast.Assign)
              and unparse(n.targets[0]) == "result.non_kv_cache_memory"]
    if values == ["result.total_consumed + result.transient_peak_headroom"]:
        return "consumed"
    if values != ["non_torch_memory + peak_activation_memory + result.weights_memory"]:
        release.fail(rel, "memory_profiling", "result.non_kv_cache_memory = the snapshot difference or "
                     "total_consumed + transient_peak_headroom, got %s" % values)
    determine = release.function(WORKER, "Worker.determine_available_memory")
    inside = any(isinstance(n, ast.With) and "memory_profiling(" in unparse(n.items[0].context_expr) and
                 "profile_cudagraph_memory(" in "".join(unparse(s) for s in n.body) for n in ast.walk(determine))
    return "snapshot-graphs" if inside else "snapshot"


def cuda_graph_estimate(release):
    """{"v1", "v2"}: the estimate is subtracted by default (env default on) and that runner computes one."""
    env = env_default(release, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")
    if env not in ("absent", True, False):
        release.fail("envs.py", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "a bool default, got %r" % (env,))
    on = env is True and "profile_cudagraph_memory(" in unparse(
        release.function(WORKER, "Worker.determine_available_memory"))
    return {"v1": on and _estimates(release, V1_RUNNER), "v2": on and _estimates(release, V2_RUNNER)}


def _estimates(release, rel):
    """The runner has a profile_cudagraph_memory that is not a stub returning 0."""
    fn = method(release, rel, "profile_cudagraph_memory") if release.has(rel) else None
    if fn is None:
        return False
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    return unparse(body[0]) != "return 0" if len(body) == 1 else True


def startup_plan(release):
    rel = "v1/worker/startup_plan.py"
    if not release.has(rel):
        return None
    value = release.module_assign(rel, "PLAN_SCHEMA_VERSION")
    if not (isinstance(value, ast.Constant) and isinstance(value.value, int)):
        release.fail(rel, "PLAN_SCHEMA_VERSION", "an int constant")
    return value.value


def load_formats(release):
    """What --load-format takes: the LoadFormats Literal of model_executor/model_loader/__init__.py (the parser types
    it `str | LoadFormats`: a loader a plugin registers parses too, but no other name loads)."""
    rel = "model_executor/model_loader/__init__.py"
    value = release.module_assign(rel, "LoadFormats")
    if not (isinstance(value, ast.Subscript) and unparse(value.value) == "Literal"):
        release.fail(rel, "LoadFormats", "a Literal[...] of load format names")
    names = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
    return sorted(literal(name) for name in names)


def runner_v2(release):
    """When the V2 model runner is the default (schema runner_v2; "moe" is this table's addition: MoE models of a
    listed architecture qualify). The rule comes from running VllmConfig.use_v2_model_runner on model stubs."""
    rel = "config/vllm.py"
    rule = {"rule": "never", "archs": [], "quantized": False, "hybrid_listed": False, "moe": False}
    if not release.has(V2_RUNNER):
        return rule
    if not release.has(V1_RUNNER):
        return dict(rule, rule="only", quantized=True, hybrid_listed=True, moe=True)
    env = env_default(release, "VLLM_USE_V2_MODEL_RUNNER")
    prop = release.function(rel, "VllmConfig.use_v2_model_runner", required=False)
    if prop is None:
        if env is not False:
            release.fail("envs.py", "VLLM_USE_V2_MODEL_RUNNER", "default 0 when VllmConfig has no use_v2_model_runner")
        return rule
    if env is not None:
        release.fail("envs.py", "VLLM_USE_V2_MODEL_RUNNER", "default None (VllmConfig.use_v2_model_runner decides)")
    archs, decide = _v2_decider(release, rel, prop)
    grid = [dict(zip(("listed", "moe", "quantized", "hybrid", "attention_free"), bits))
            for bits in itertools.product((False, True), repeat=5)]
    got = [decide(case) for case in grid]
    for candidate in _v2_rules():
        if got == [candidate[1](case) for case in grid]:
            return dict(candidate[0], archs=sorted(archs) if candidate[0]["rule"] != "all" else [])
    release.fail(rel, "VllmConfig.use_v2_model_runner", "one of the rules all, listed, listed-or-dense (see the "
                 "schema), got %s" % got)


def _v2_rules():
    """(row, predicate) candidates for the V2 default."""
    out = [({"rule": "all", "quantized": True, "hybrid_listed": True, "moe": True}, lambda c: True)]
    for q, m, h in itertools.product((False, True), repeat=3):
        out.append(({"rule": "listed", "quantized": q, "hybrid_listed": h, "moe": m},
                    lambda c, q=q, m=m, h=h: c["listed"] and (m or not c["moe"]) and (q or not c["quantized"])
                    and (h or not c["hybrid"])))
        if m:
            out.append(({"rule": "listed-or-dense", "quantized": q, "hybrid_listed": h, "moe": True},
                        lambda c, q=q, h=h: (c["listed"] or not c["moe"]) and (q or not c["quantized"]) and
                        (not c["hybrid"] or (h and c["listed"])) and not c["attention_free"]))
    return out


def _v2_decider(release, rel, prop):
    """(listed architectures, case -> bool) running use_v2_model_runner with its helpers from the source."""
    archs = frozenset()
    listed = release.module_assign(rel, "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES")
    if listed is not None:
        archs = literal(listed)
    stubs = {"envs": Strict("envs", VLLM_USE_V2_MODEL_RUNNER=None), "HAS_TRITON": True,
             "current_platform": platform("9.0"), "DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES": archs}
    rocm = release.module_assign(rel, "ROCM_DEFAULT_MRV1_ARCHITECTURES")
    if rocm is not None:
        stubs["ROCM_DEFAULT_MRV1_ARCHITECTURES"] = literal(rocm)
    nodes = [prop]
    for name in ("VllmConfig._is_default_v2_model_runner_model", "default_v2_model_runner_architectures"):
        node = release.function(rel, name, required=False)
        nodes += [node] if node else []
    namespace = compile_nodes(nodes, stubs)

    def decide(case):
        model = Strict("model_config", runner_type="generate", is_diffusion=False, is_moe=case["moe"],
                       is_quantized=case["quantized"], is_hybrid=case["hybrid"],
                       is_attention_free=case["attention_free"],
                       architectures=[sorted(archs)[0] if case["listed"] and archs else "NotListedForCausalLM"])
        config = Strict("VllmConfig", model_config=model, speculative_config=None, watermark_config=None,
                        parallel_config=Strict("parallel_config", prefill_context_parallel_size=1),
                        attention_config=Strict("attention_config", hisparse_config=None),
                        _get_v2_model_runner_unsupported_features=lambda: [],
                        _dflash_needs_multi_kv_group=lambda: False, _is_dflash2_draft=lambda: False)
        if "_is_default_v2_model_runner_model" in namespace:
            config.__dict__["_is_default_v2_model_runner_model"] = \
                lambda: namespace["_is_default_v2_model_runner_model"](config)
        return bool(run(release, rel, "VllmConfig.use_v2_model_runner", namespace["use_v2_model_runner"], config))
    return archs, decide


# ----------------------------------------------------------------------------------------------- attention
CUDA = "platforms/cuda.py"
CPU = "platforms/cpu.py"
# Helpers of backend methods that are taken from the source rather than stubbed.
SOURCE_HELPERS = ("flash_attn_supports_fp8", "flash_attn_supports_kv_cache_dtype", "is_quantized_kv_cache")
# Backend class members the facts need (and their _get_* helpers); the rest is left out of the synthesized copy.
BACKEND_MEMBERS = ("get_name", "supports_compute_capability", "supported_kv_cache_dtypes", "supports_kv_cache_dtype",
                   "get_supported_kernel_block_sizes", "supported_kernel_block_sizes", "supports_block_size")


def registry(release):
    """AttentionBackendEnum member -> class path (None: 0.11.0, which has no registry)."""
    rel = release.first(["v1/attention/backends/registry.py", "attention/backends/registry.py"])
    if rel is None:
        return None
    enum = release.cls(rel, "AttentionBackendEnum")
    return {st.targets[0].id: st.value.value for st in enum.body if isinstance(st, ast.Assign)
            and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str) and st.value.value}


def class_chain(release, path):
    """[(rel, ClassDef)] from the class at a dotted path up through its vLLM bases (first base first)."""
    module, name = path.rsplit(".", 1)
    rel = module_rel(release, module)
    if rel is None:
        release.fail(module.replace(".", "/") + ".py", name, "the backend class %s" % path)
    node = release.cls(rel, name)
    chain = [(rel, node)]
    imports = release.imports(rel)
    for base in node.bases:
        base_name = unparse(base)
        if base_name in imports and module_rel(release, imports[base_name].rsplit(".", 1)[0]):
            chain += class_chain(release, imports[base_name])
        elif release.cls(rel, base_name, required=False):
            chain += class_chain(release, "%s.%s" % (module, base_name))
    return chain


def backend_class(release, path, stubs):
    """A Python class standing for the backend: its chain's BACKEND_MEMBERS, compiled from the source in stubs."""
    made = object
    for rel, node in reversed(class_chain(release, path)):
        members = [st for st in node.body
                   if (isinstance(st, ast.FunctionDef)
                       and (st.name in BACKEND_MEMBERS or st.name.startswith("_get_")))
                   or (isinstance(st, (ast.Assign, ast.AnnAssign))
                       and unparse(st.targets[0] if isinstance(st, ast.Assign) else st.target) in BACKEND_MEMBERS)]
        copy = ast.ClassDef(name=node.name, bases=[ast.Name("_Base", ast.Load())], keywords=[],
                            body=members or [ast.Pass()], decorator_list=[], type_params=[])
        helpers = _source_helpers(release, rel, stubs)
        made = compile_nodes([copy], dict(stubs, _Base=made, MultipleOf=MultipleOf, **helpers))[node.name]
        made._source = (rel, node.name)
    return made


def _source_helpers(release, rel, stubs):
    """The KV-dtype and FlashAttention support tests a backend module imports, compiled from their own source in
    stubs where they need nothing else (0.20's is_quantized_kv_cache is a string test; 0.22's asks a registry of
    dtype handlers, and the stub's "not auto/float16/bfloat16" stands for it)."""
    out = {}
    for name, path in release.imports(rel).items():
        if name in SOURCE_HELPERS:
            module = module_rel(release, path.rsplit(".", 1)[0])
            node = release.function(module, name, required=False) if module else None
            if node is None:
                release.fail(rel, name, "%s defined in %s" % (name, path))
            if _free_names(node) <= set(stubs) | set(dir(builtins)):
                out[name] = compile_nodes([node], stubs)[name]
            elif name not in stubs:
                release.fail(module, name, "a function that needs only %s" % ", ".join(sorted(stubs)))
    return out


def _free_names(fn):
    """Names a function reads that it does not define (arguments, assignments, its own imports)."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.asname or a.name for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    return {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - bound


def owner(cls, member):
    """(rel, class name) of the class in cls's chain that defines member (None: none)."""
    for klass in cls.__mro__:
        if member in vars(klass):
            return klass._source
    return None


def cpu_torch(amx):
    """torch with only what the CPU backends ask: AMX tiles as given, no AVX-512 (the conservative CPU)."""
    return Strict("torch", cpu=Strict("torch.cpu", _is_amx_tile_supported=lambda: amx,
                                      _is_avx512_supported=lambda: False))


def _attention_stubs(device):
    """Globals of the backend methods on the device (FA3 and FlashMLA on Hopper, FlashInfer with TRT-LLM attention
    on Blackwell, no model-specific config)."""
    return {"current_platform": device, "get_current_vllm_config_or_none": lambda: None,
            "get_current_vllm_config": lambda: types.SimpleNamespace(model_config=None, cache_config=None),
            "get_flash_attn_version": lambda *a, **k: 3 if device.cap.major == 9 else 2,
            "is_quantized_kv_cache": lambda d: d not in (None, "auto", "bfloat16", "float16", "float32"),
            "supports_trtllm_attention": lambda *a, **k: device.cap.major == 10, "_nvfp4_kv_on_fa2": lambda: False,
            "torch": cpu_torch(amx=False)}


def kernel_sizes(release, cls, path):
    """(sizes, multiple_of): get_supported_kernel_block_sizes run with no current vLLM config (the default path,
    not a model-specific one), else the supported_kernel_block_sizes ClassVar (0.11.1-0.11.2), else 0.11.0's
    `block_size % N` check in get_kv_cache_shape (no check: any size)."""
    where = owner(cls, "get_supported_kernel_block_sizes")
    if where:
        items = run(release, where[0], "%s.get_supported_kernel_block_sizes" % where[1],
                    cls.get_supported_kernel_block_sizes)
    elif owner(cls, "supported_kernel_block_sizes"):
        where, items = owner(cls, "supported_kernel_block_sizes"), cls.supported_kernel_block_sizes
    else:
        return _legacy_sizes(release, path)
    multiple = [i.base for i in items if isinstance(i, MultipleOf)]
    sizes = multiple or [i for i in items if isinstance(i, int) and not isinstance(i, bool)]
    if len(sizes) != len(items) or multiple and len(multiple) != 1:
        release.fail(where[0], "%s.get_supported_kernel_block_sizes" % where[1], "ints, or one MultipleOf(n), "
                     "got %r" % (items,))
    return sorted(sizes), bool(multiple)


def _legacy_sizes(release, path):
    module, name = path.rsplit(".", 1)
    for _name, node in class_chain(release, path):
        shape = next((st for st in node.body if isinstance(st, ast.FunctionDef) and st.name == "get_kv_cache_shape"),
                     None)
        if shape is None:
            continue
        for n in ast.walk(shape):
            if isinstance(n, ast.If) and re.fullmatch(r"block_size % \d+ != 0", unparse(n.test)):
                return [n.test.left.right.value], True
        return [1], True
    release.fail(module.replace(".", "/") + ".py", name, "get_supported_kernel_block_sizes or get_kv_cache_shape")


def backend_facts(release, name, path, kv_dtypes, ccs):
    """BACKEND of the schema for one CUDA backend, given the ccs it may run on (None: ask the class)."""
    device = platform("9.0")
    cls = backend_class(release, path, _attention_stubs(device))
    sizes, multiple = kernel_sizes(release, cls, path)
    _check_block_override(release, cls, sizes, multiple)
    if ccs is None:
        where = owner(cls, "supports_compute_capability")
        ccs = [cc for cc in CC_GRID if run(release, where[0], "%s.supports_compute_capability" % where[1],
                                           cls.supports_compute_capability, capability(cc))]
        if name == "FLASHMLA":  # dense FlashMLA is Hopper-only whatever supports_compute_capability says
            ccs = [cc for cc in ccs if flashmla_dense(release, cc)]
    accepted = {}
    for cc in ccs:
        device.cc = cc
        accepted[cc] = _kv_accepted(release, cls, kv_dtypes)
    common = [d for d in kv_dtypes if all(d in accepted[cc] for cc in ccs)] if ccs else []
    out = {"runs_on": ccs, "sizes": sizes, "multiple_of": multiple, "kv_dtypes": common}
    by_cc = {cc: dtypes for cc, dtypes in accepted.items() if dtypes != common}
    if by_cc:
        out["kv_dtypes_by_cc"] = by_cc
    return out


def _kv_accepted(release, cls, kv_dtypes):
    """The KV dtypes supports_kv_cache_dtype accepts, less those of a family it accepts by a prefix test that the
    backend's mapping then refuses (PREFIX_MAPPINGS)."""
    where = owner(cls, "supports_kv_cache_dtype")
    if where is None:  # 0.11.0: no backend checks the KV dtype
        return list(kv_dtypes)
    accepted = [d for d in kv_dtypes if run(release, where[0], "%s.supports_kv_cache_dtype" % where[1],
                                            cls.supports_kv_cache_dtype, d)]
    family, mapped = release.memo(("kv-prefix", where), lambda: _prefix_mapping(release, cls, where, kv_dtypes))
    return [d for d in accepted if d not in family or d in mapped]


# Backends whose supports_kv_cache_dtype accepts a family of KV dtypes by a prefix test (name.startswith(...), or a
# helper that tests one, such as 0.20-0.21's is_quantized_kv_cache) while a later step maps only some of those
# names: one it does not map passes the backend choice and then fails vLLM. FlashAttention 0.11.1-0.21 takes every
# fp8* name (0.20-0.21: every quantized one) on Hopper, and get_fp8_dtype_for_flashattn, which the metadata builder
# and forward call under the same test, maps fp8 and fp8_e4m3 and raises "Unrecognized FP8 dtype" for the rest in
# the profiling run. Owner class of supports_kv_cache_dtype -> (file of the mapping, None: the backend's own;
# the mapping function), or None where the family meets no such mapping. A prefix acceptance in a class not
# listed is a ShapeError: see what its names meet after the backend choice, and list it.
PREFIX_MAPPINGS = {
    "FlashAttentionBackend": (None, "FlashAttentionBackend.get_fp8_dtype_for_flashattn"),
    # turboquant_* (0.20+): the backend's impl builds TurboQuantConfig.from_cache_dtype (the TQ_PRESETS names).
    "TurboQuantAttentionBackend": ("model_executor/layers/quantization/turboquant/config.py",
                                   "TurboQuantConfig.from_cache_dtype"),
    # nvfp4* (0.28+): the builder and impl take every nvfp4* name as "nvfp4" on the TRT-LLM path;
    # get_dtype_for_flashinfer serves the other names (and maps the nvfp4 prefix too).
    "FlashInferBackend": None,
}


def _prefix_mapping(release, cls, where, kv_dtypes):
    """(family, mapped): the names of kv_dtypes that supports_kv_cache_dtype accepts by a prefix test and those of
    them its PREFIX_MAPPINGS mapping maps (nothing, nothing: the acceptance names its dtypes)."""
    rel, cls_name = where
    qualname = "%s.supports_kv_cache_dtype" % cls_name
    fn = release.function(rel, qualname)
    params = [a.arg for a in fn.args.args]
    params = params if "staticmethod" in {unparse(d) for d in fn.decorator_list} else params[1:]
    if len(params) != 1:
        release.fail(rel, qualname, "one argument, the KV dtype (after cls), got (%s)" % ", ".join(params))
    param, test, bounded = params[0], None, False
    for st in fn.body:
        if isinstance(st, ast.If) and re.fullmatch(r"%s not in .+" % param, unparse(st.test)) and \
                [unparse(b) for b in st.body] == ["return False"]:
            bounded = True  # names outside a list refused first (0.27+ FlashAttention): the list decides
        elif isinstance(st, ast.If) and _prefix_test(release, rel, st.test, param) and \
                any(isinstance(n, ast.Return) for n in ast.walk(st)):
            test = st.test
            break
        elif isinstance(st, ast.Return) and st.value is not None and _prefix_test(release, rel, st.value, param):
            test = st.value
            break
    if test is None or bounded:
        if not bounded and any(_prefix_test(release, rel, n, param) for n in ast.walk(fn) if n is not fn):
            release.fail(rel, qualname, "a prefix test on %s only as a top-level `if TEST: return ...` or `return "
                         "TEST`" % param)
        return frozenset(), frozenset()
    if cls_name not in PREFIX_MAPPINGS:
        release.fail(rel, qualname, "a backend PREFIX_MAPPINGS knows: it accepts KV dtypes by the prefix test `%s`; "
                     "add what maps the names it accepts (or None)" % unparse(test))
    method = getattr(cls.supports_kv_cache_dtype, "__func__", cls.supports_kv_cache_dtype)
    pick = eval("lambda %s: %s" % (param, unparse(test)), method.__globals__)  # noqa: S307 - the release's own test
    family = frozenset(d for d in kv_dtypes if run(release, rel, qualname, pick, d))
    if PREFIX_MAPPINGS[cls_name] is None:
        return family, family
    map_rel, map_name = PREFIX_MAPPINGS[cls_name]
    map_rel = map_rel or rel
    if not release.has(map_rel) or release.function(map_rel, map_name, required=False) is None:
        release.fail(map_rel, map_name, "the function that maps the KV dtypes %s accepts by the prefix test `%s` "
                     "(PREFIX_MAPPINGS)" % (qualname, unparse(test)))
    short = map_name.rsplit(".", 1)[-1]
    if not any(isinstance(n, ast.Call) and unparse(n.func).rsplit(".", maxsplit=1)[-1] == short
               for n in ast.walk(release.tree(rel))):
        release.fail(rel, cls_name, "a call of %s (PREFIX_MAPPINGS) on the KV dtype" % map_name)
    mapped = _mapped_names(release, map_rel, map_name, kv_dtypes)
    return family, frozenset(d for d in family if d in mapped)


def _prefix_test(release, rel, node, param):
    """Whether node (an expression) tests param by a prefix: param.startswith(...) anywhere in it, or a call of a
    helper on param whose own source tests its argument with startswith (0.20-0.21's is_quantized_kv_cache)."""
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        if isinstance(n.func, ast.Attribute) and n.func.attr == "startswith" and unparse(n.func.value) == param:
            return True
        if isinstance(n.func, ast.Name) and len(n.args) == 1 and unparse(n.args[0]) == param:
            path = release.imports(rel).get(n.func.id)
            module = module_rel(release, path.rsplit(".", 1)[0]) if path else rel
            helper = release.function(module, n.func.id, required=False) if module else None
            if helper is not None and helper.args.args and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "startswith"
                    and unparse(c.func.value) == helper.args.args[0].arg for c in ast.walk(helper)):
                return True
    return False


def _mapped_names(release, rel, qualname, kv_dtypes):
    """The names of kv_dtypes a mapping function maps (it raises for the others), read from its source. Shapes:
    an if/elif chain on the name (`name in (...)`, `name == "..."`, `name.startswith("...")`) whose branches
    return, ending in a raise; or `if name not in TABLE: raise ...` first, TABLE a literal of the module (its keys).
    """
    fn = release.function(rel, qualname)
    decorators = {unparse(d) for d in fn.decorator_list}
    args = [a.arg for a in fn.args.args]
    args = args[1:] if "." in qualname and "staticmethod" not in decorators else args
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    expected = ("a mapping of the KV dtype of a known shape: `if NAME in (...): return ...` [`elif NAME == \"...\"` / "
                "`elif NAME.startswith(\"...\")`: return ...] `else: raise ...`, or `if NAME not in TABLE: raise ...` "
                "with TABLE a literal of the module")
    if not args or not body or not isinstance(body[0], ast.If):
        release.fail(rel, qualname, expected)
    name, first = args[0], body[0]
    # `if name not in TABLE: ... raise`
    if isinstance(first.test, ast.Compare) and unparse(first.test.left) == name and len(first.test.ops) == 1 and \
            isinstance(first.test.ops[0], ast.NotIn) and isinstance(first.test.comparators[0], ast.Name) and \
            isinstance(first.body[-1], ast.Raise) and not first.orelse:
        table = release.module_assign(rel, first.test.comparators[0].id)
        try:
            value = literal(table) if table is not None else None
        except ValueError:
            value = None
        if not isinstance(value, (dict, list, tuple, set, frozenset)):
            release.fail(rel, qualname, "%s: %s a module-level literal" % (expected, first.test.comparators[0].id))
        return [d for d in kv_dtypes if d in value]
    # if/elif chain, each branch returning, then a raise
    tests, node = [], first
    while True:
        if not node.body or not isinstance(node.body[-1], ast.Return):
            release.fail(rel, qualname, expected)
        tests.append(node.test)
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
        elif len(node.orelse) == 1 and isinstance(node.orelse[0], ast.Raise) or \
                not node.orelse and len(body) > 1 and isinstance(body[1], ast.Raise):
            break
        else:
            release.fail(rel, qualname, expected)
    matchers = []
    for test in tests:
        if isinstance(test, ast.Compare) and unparse(test.left) == name and len(test.ops) == 1 and \
                isinstance(test.ops[0], (ast.In, ast.Eq)):
            try:
                value = literal(test.comparators[0])
            except ValueError:
                release.fail(rel, qualname, "%s (got `%s`)" % (expected, unparse(test)))
            if isinstance(test.ops[0], ast.Eq) and isinstance(value, str):
                matchers.append(lambda d, v=value: d == v)
            elif isinstance(test.ops[0], ast.In) and isinstance(value, (list, tuple, set, frozenset)):
                matchers.append(lambda d, v=value: d in v)
            else:
                release.fail(rel, qualname, "%s (got `%s`)" % (expected, unparse(test)))
        elif isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "startswith" \
                and unparse(test.func.value) == name and len(test.args) == 1 and not test.keywords and \
                isinstance(test.args[0], ast.Constant) and isinstance(test.args[0].value, str):
            matchers.append(lambda d, v=test.args[0].value: d.startswith(v))
        else:
            release.fail(rel, qualname, "%s (got `%s`)" % (expected, unparse(test)))
    return [d for d in kv_dtypes if any(m(d) for m in matchers)]


def _check_block_override(release, cls, sizes, multiple):
    """A supports_block_size override must agree with the kernel sizes (any multiple, or exactly one of them)."""
    where = owner(cls, "supports_block_size")
    if where is None or where[1] in ("AttentionBackend",):
        return
    for block in range(1, 1025):
        ok = run(release, where[0], "%s.supports_block_size" % where[1], cls.supports_block_size, block)
        if ok != (any(block % s == 0 for s in sizes) if multiple else block in sizes):
            release.fail(where[0], "%s.supports_block_size" % where[1], "a test that the kernel sizes %s%s accept "
                         "the block (it says %s for %d)" % ("multiples of " if multiple else "", sizes, ok, block))


def flashmla_dense(release, cc):
    """is_flashmla_dense_supported() (0.11: is_flashmla_supported()) run on cc, FlashMLA built."""
    rel = release.first(["v1/attention/ops/flashmla.py", "attention/ops/flashmla.py"])

    def compiled():
        nodes = [n for n in release.tree(rel).body if isinstance(n, ast.FunctionDef) and
                 n.name in ("is_flashmla_dense_supported", "is_flashmla_supported", "_is_flashmla_available")]
        device = platform(cc)
        namespace = compile_nodes(nodes, {"current_platform": device, "_flashmla_C_AVAILABLE": True,
                                          "_flashmla_extension_C_AVAILABLE": True})
        name = "is_flashmla_dense_supported" if "is_flashmla_dense_supported" in namespace else \
            "is_flashmla_supported"
        if name not in namespace:
            release.fail(rel, "is_flashmla_dense_supported", "the FlashMLA support test")
        return device, name, namespace[name]
    device, name, fn = release.memo("flashmla", compiled)
    device.cc = cc
    return bool(run(release, rel, name, fn)[0])


def cuda_attention(release, kv_dtypes, block_sizes):
    """block_size, block_rule and cuda (schema): backend priorities per cc, each backend's facts, forced MLA."""
    names = registry(release)
    forced = _platform_sets_block(release)
    if forced == (release.function("platforms/interface.py", "Platform.update_block_size_for_backend",
                                   required=False) is not None):
        release.fail(CUDA, "CudaPlatformBase.check_and_update_config", "the block size set by the platform "
                     "(0.11-0.17) or by Platform.update_block_size_for_backend (0.18+), not both or neither")
    probes = block_sizes or list(PROBE_BLOCKS)
    if forced:
        default = _cuda_block(release, "8.0", False, None)
        forced_mla = {cc: f for cc in CC_GRID for f in [_forced_mla(release, cc, probes, default)] if f}
    else:
        default = field_default(release, CACHE, "CacheConfig", "DEFAULT_BLOCK_SIZE")
        forced_mla = None
    if not isinstance(default, int):
        release.fail(CACHE, "CacheConfig.DEFAULT_BLOCK_SIZE", "an int (or platforms/cuda.py setting one)")
    if names is None:
        standard, mla, paths = _legacy_priorities(release, forced_mla, default)
    else:
        standard, mla = (_priorities(release, use_mla) for use_mla in (False, True))
        paths = names
    legacy = names is None
    used = sorted({n for group in standard + mla for n in group[1]})
    backends = {}
    for name in used:
        ccs = sorted({cc for group in standard + mla if name in group[1] for cc in group[0]},
                     key=CC_GRID.index) if legacy else None
        backends[name] = backend_facts(release, name, paths[name], kv_dtypes, ccs)
    return {"block_size": default, "block_rule": "forced" if forced else "preferred",
            "cuda": {"standard": standard, "mla": mla, "backends": backends, "forced_mla": forced_mla}}


def _platform_sets_block(release):
    fn = release.function(CUDA, "CudaPlatformBase.check_and_update_config")
    return any(isinstance(n, ast.Assign) and unparse(n.targets[0]) == "cache_config.block_size" for n in ast.walk(fn))


def _priorities(release, use_mla):
    """PRIORITY: _get_backend_priorities run per cc for a dense model (sparse backends, which only sparse-attention
    models take, left out), ccs with the same order grouped."""
    fn = compile_nodes([release.function(CUDA, "_get_backend_priorities")],
                       {"is_quantized_kv_cache": lambda d: d not in (None, "auto")})["_get_backend_priorities"]
    groups = []
    for cc in CC_GRID:
        order = [n for n in run(release, CUDA, "_get_backend_priorities", fn, use_mla=use_mla,
                                device_capability=capability(cc), num_heads=None, kv_cache_dtype=None,
                                use_non_causal=False, head_size=None, use_mm_prefix=False) if "SPARSE" not in n]
        same = next((g for g in groups if g[1] == order), None)
        if same:
            same[0].append(cc)
        else:
            groups.append([[cc], order])
    return groups


def _cuda_block(release, cc, use_mla, user, qk_nope=128):
    """The block size CudaPlatformBase.check_and_update_config leaves (run up to its last statement that mentions
    block_size) for a user value (None: none given)."""
    where = "CudaPlatformBase.check_and_update_config"
    device = platform(cc)

    def compiled():
        node = release.function(CUDA, where)
        keep = max(i for i, st in enumerate(node.body) if "block_size" in unparse(st)) + 1
        flashmla = {"current": None}
        stubs = {"is_flashmla_supported": lambda: (flashmla_dense(release, flashmla["current"]), None)}
        stubs["is_flashmla_dense_supported"] = stubs["is_flashmla_supported"]
        return flashmla, compile_nodes([node], stubs, keep=keep)["check_and_update_config"]
    flashmla, fn = release.memo("cuda-block", compiled)
    flashmla["current"] = cc
    # 0.11-0.12 write envs.VLLM_ATTENTION_BACKEND: every call starts from a clean environment.
    fn.__globals__["envs"] = types.SimpleNamespace(VLLM_ATTENTION_BACKEND=None, VLLM_USE_V1=True)
    cache = types.SimpleNamespace(block_size=user)
    model = types.SimpleNamespace(use_mla=use_mla, hf_config=types.SimpleNamespace(),
                                  hf_text_config=types.SimpleNamespace(qk_nope_head_dim=qk_nope))
    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(worker_cls="set"), model_config=model,
                                   cache_config=cache, attention_config=types.SimpleNamespace(backend=None),
                                   speculative_config=None)
    run(release, CUDA, where, fn, device, config)
    if not isinstance(cache.block_size, int):
        release.fail(CUDA, where, "an int block size set, got %r" % (cache.block_size,))
    return cache.block_size


def _forced_mla(release, cc, probes, default):
    """FORCED entry of one cc ({} when nothing is forced): per qk_nope_head_dim, the sizes kept and the rest's."""
    out = {}
    for key, qk in (("qk_nope_128", 128), ("other", 64)):
        results = {b: _cuda_block(release, cc, True, b, qk) for b in probes}
        keep = [b for b in probes if results[b] == b]
        rest = {results[b] for b in probes if b not in keep}
        if len(rest) > 1:
            release.fail(CUDA, "CudaPlatformBase.check_and_update_config", "one forced MLA size on %s, got %s"
                         % (cc, sorted(rest)))
        entry = {"keep": keep, "else": rest.pop() if rest else None}
        unset = _cuda_block(release, cc, True, None, qk)
        if unset != (default if default in keep else entry["else"]):
            release.fail(CUDA, "CudaPlatformBase.check_and_update_config", "the MLA default on %s to follow the "
                         "forced sizes (%s), got %s" % (cc, entry, unset))
        out[key] = entry
    return out if any(e["else"] is not None for e in out.values()) else {}


def _legacy_priorities(release, forced_mla, default):
    """0.11.0: CudaPlatformBase.get_attn_backend_cls (an if-chain) run per cc; each PRIORITY entry is the chain's
    outcome. Returns (standard, mla, name -> class path)."""
    where = "CudaPlatformBase.get_attn_backend_cls"
    node = release.function(CUDA, where)

    class Supported:
        can_import = head_size = dtype = True

        def __bool__(self):
            return True
    paths, out = {}, {False: [], True: []}
    for use_mla in (False, True):
        for cc in CC_GRID:
            entry = (forced_mla or {}).get(cc, {}).get("qk_nope_128")
            block = default if not use_mla or not entry or default in entry["keep"] else entry["else"]
            fn = compile_nodes([node], {
                "is_flashmla_supported": lambda cc=cc: (flashmla_dense(release, cc), None),
                "flash_attn_supports_mla": lambda cc=cc: capability(cc).major == 9,
                "is_attn_backend_supported": lambda *a, **k: Supported(), "set_kv_cache_layout": lambda *a: None,
                "envs": types.SimpleNamespace(VLLM_ATTENTION_BACKEND=None, VLLM_USE_V1=True)})[node.name]
            path = run(release, CUDA, where, fn, platform(cc), None, 128, "bfloat16", "auto", block, True, use_mla,
                       False, False)
            if not isinstance(path, str) or not path.startswith("vllm."):
                release.fail(CUDA, where, "a backend class path, got %r" % (path,))
            name = _class_name(release, path)
            paths[name] = path
            same = next((g for g in out[use_mla] if g[1] == [name]), None)
            if same:
                same[0].append(cc)
            else:
                out[use_mla].append([[cc], [name]])
    return out[False], out[True], paths


def _class_name(release, path):
    """A backend's get_name() (0.11.0 names its classes only there)."""
    cls = backend_class(release, path, _attention_stubs(platform("9.0")))
    if not owner(cls, "get_name"):
        release.fail(path.rsplit(".", 1)[0].replace(".", "/"), path.rsplit(".", 1)[1], "a get_name() method")
    return cls.get_name()


def cpu_attention(release, kv_dtypes, block_sizes):
    """cpu (schema): the CPU platform's backend for standard attention and MLA (with and without AMX tiles), the
    block size it sets by default, what it forces and the KV dtypes the backend takes. 0.11.0 is read as the
    official CPU build without IPEX (default 16, any other size refused)."""
    where = "CpuPlatform.get_attn_backend_cls"
    fn = release.function(CPU, where)
    names = registry(release)
    if not isinstance(fn.body[-1], ast.Return):
        release.fail(CPU, where, "a final return of the standard attention backend")
    standard = _cpu_backend_name(release, fn.body[-1].value, names)
    mla_branch = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and unparse(n.test).endswith("use_mla")), None)
    if mla_branch is None:
        release.fail(CPU, where, "an `if ...use_mla:` branch")
    if "MLA is not supported on CPU" in unparse(mla_branch):
        mla = None
    else:
        mla_names = [_cpu_backend_name(release, r.value, names) for st in mla_branch.body for r in ast.walk(st)
                     if isinstance(r, ast.Return)]
        if len(mla_names) == 2 and "_is_amx_tile_supported" in unparse(mla_branch):
            amx, no_amx = mla_names
        elif len(mla_names) == 1:
            amx, no_amx = None, mla_names[0]
        else:
            release.fail(CPU, where, "one MLA backend, or an AMX one and another, got %s" % mla_names)
        mla = {"amx": _cpu_record(release, amx, names, True, True, kv_dtypes, block_sizes) if amx else None,
               "no_amx": _cpu_record(release, no_amx, names, True, False, kv_dtypes, block_sizes, forced=True)}
    return {"standard": _cpu_record(release, standard, names, False, False, kv_dtypes, block_sizes), "mla": mla}


def _cpu_backend_name(release, node, names):
    """AttentionBackendEnum.X.get_path() -> X; a class path string -> that class's get_name()."""
    match = re.fullmatch(r"AttentionBackendEnum\.(\w+)\.get_path\(\)", unparse(node))
    if match:
        return match.group(1)
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm."):
        return node.value if names is None else next(n for n, p in names.items() if p == node.value)
    release.fail(CPU, "CpuPlatform.get_attn_backend_cls", "returns of AttentionBackendEnum.X.get_path() or a class "
                 "path, got %s" % unparse(node))


def _cpu_record(release, name, names, use_mla, amx, kv_dtypes, block_sizes, forced=False):
    """{"backend", "default", "sizes", "multiple_of", "kv_dtypes"} (+ "forced") of one CPU backend."""
    path = name if names is None else names[name]
    stubs = _attention_stubs(platform("9.0"))
    stubs["torch"] = cpu_torch(amx)
    cls = backend_class(release, path, stubs)
    label = _class_name(release, path) if names is None else name
    sizes, multiple = kernel_sizes(release, cls, path)
    probes = block_sizes or list(PROBE_BLOCKS)
    kept = [b for b in probes if _cpu_block(release, use_mla, amx, b) == b]
    if kept != probes and not forced:  # the platform refuses (0.11.0 without IPEX) what it does not keep
        sizes, multiple = kept, False
    record = {"backend": label, "default": _cpu_default(release, cls, use_mla, amx, sizes, multiple),
              "sizes": sizes, "multiple_of": multiple, "kv_dtypes": _kv_accepted(release, cls, kv_dtypes)}
    if forced:
        given = next(b for b in (64, 32, 128) if b in probes)
        record["forced"] = None if _cpu_block(release, use_mla, amx, given) == given else \
            _cpu_block(release, use_mla, amx, given)
    return record


def _cpu_default(release, cls, use_mla, amx, sizes, multiple):
    """The block size with no --block-size: CpuPlatform.check_and_update_config's, then (0.33+)
    update_block_size_for_backend's _preferred_block_size_for_backends(backends, N) (get_preferred_block_size:
    N if the backend takes it, else its smallest size)."""
    block = _cpu_block(release, use_mla, amx, None)
    update = release.function(CPU, "CpuPlatform.update_block_size_for_backend", required=False)
    preferred = [c for c in ast.walk(update) if isinstance(c, ast.Call) and
                 unparse(c.func) == "cls._preferred_block_size_for_backends"] if update else []
    if not preferred or (use_mla and not amx and _cpu_block(release, use_mla, amx, 64) != 64):
        return block
    default = literal(preferred[0].args[1])
    takes = any(default % s == 0 for s in sizes) if multiple else default in sizes
    return default if takes else min(sizes)


def _cpu_block(release, use_mla, amx, user):
    """The block size CpuPlatform.check_and_update_config leaves (run up to its last statement that mentions
    block_size) for a user value (None: none given; 0.18+ start from CacheConfig.DEFAULT_BLOCK_SIZE). A refused
    value (0.11.0 without IPEX: RuntimeError) gives None."""
    where = "CpuPlatform.check_and_update_config"

    def compiled():
        node = release.function(CPU, where)
        keep = max(i for i, st in enumerate(node.body) if "block_size" in unparse(st)) + 1
        amx_holder = {"on": False}
        stubs = {"find_spec": lambda name: None, "HAS_TRITON": True, "CpuArchEnum": types.SimpleNamespace(X86="x86"),
                 "torch": Strict("torch", cpu=Strict("torch.cpu", _is_amx_tile_supported=lambda: amx_holder["on"],
                                                     _is_avx512_bf16_supported=lambda: False))}
        return amx_holder, compile_nodes([node], stubs, keep=keep)["check_and_update_config"]
    amx_holder, fn = release.memo("cpu-block", compiled)
    amx_holder["on"] = amx
    default = field_default(release, CACHE, "CacheConfig", "DEFAULT_BLOCK_SIZE")
    start = user if user is not None else None if default == "absent" else default
    cache = types.SimpleNamespace(block_size=start, user_specified_block_size=user is not None,
                                  cache_dtype="auto", enable_prefix_caching=True, mamba_ssm_cache_dtype="float32")
    model = types.SimpleNamespace(use_mla=use_mla, hf_config=types.SimpleNamespace(model_type="llama"),
                                  disable_cascade_attn=False, dtype="bfloat16")
    config = types.SimpleNamespace(model_config=model, cache_config=cache,
                                   attention_config=types.SimpleNamespace(backend=None),
                                   scheduler_config=types.SimpleNamespace(chunked_prefill_enabled=True))
    cls = types.SimpleNamespace(get_cpu_architecture=lambda: "x86", get_device_total_memory=lambda: 0)
    try:
        fn(cls, config)
    except RuntimeError as error:
        if "block-size" not in str(error):
            release.fail(CPU, where, "a RuntimeError only to refuse a --block-size, got %s" % error)
        return None
    except Exception as error:  # noqa: BLE001 - reported with the release, file and function
        release.fail(CPU, where, "code that runs with the stubs this module gives (it raised %s: %s)"
                     % (type(error).__name__, error))
    if not isinstance(cache.block_size, int):
        release.fail(CPU, where, "an int block size, got %r" % (cache.block_size,))
    return cache.block_size


# ----------------------------------------------------------------------------------------------- the row
def facts(root, version, flags):
    """The resolved row of releases.json for the release unpacked at root (<root>/vllm/...)."""
    release = Release(root, version)
    row = guarded(release, flag_facts, flags)
    dtypes, blocks = row["kv_cache_dtypes"], row["block_sizes"]
    for extractor, args in ((defaults, ()), (message, ()), (check, ()), (batch_defaults, ()), (sampler, ()),
                            (cuda_attention, (dtypes, blocks))):
        row.update(guarded(release, extractor, *args))
    for name, extractor, args in (
            ("in_flight", in_flight, ()), ("sw_block", sw_block, ()), ("async_scheduling", async_scheduling, ()),
            ("requested", requested, ()), ("moe_chunk", moe_chunk, ()), ("non_torch", non_torch, ()),
            ("startup_plan", startup_plan, ()), ("load_formats", load_formats, ()),
            ("cuda_graph_estimate", cuda_graph_estimate, ()), ("runner_v2", runner_v2, ()),
            ("cpu", cpu_attention, (dtypes, blocks))):
        row[name] = guarded(release, extractor, *args)
    return row


def guarded(release, extractor, *args):
    """An extractor's result; an error it did not foresee (a literal that is not one, a missing node) is a
    ShapeError naming the extractor, never a traceback or a guess."""
    try:
        return extractor(release, *args)
    except ShapeError:
        raise
    except Exception as error:  # noqa: BLE001 - turned into the message the developer needs
        raise ShapeError("vLLM %s: %s met a source shape it does not know (%s: %s); teach tools/vllm_source.py"
                         % (release.version, extractor.__name__, type(error).__name__, error)) from error

# The helper process of the Python tools (worker/agent/pytool.c): one user tool, a verl BaseTool-shaped class or
# the @function_tool functions of a file, served one call at a time. The build embeds this file in the binary
# (worker/agent/meson.build); it runs as `python3 -u -c RUNNER` with:
#
#   fd 3  a socket to the C side: JSON lines both ways
#   fd 4  the read end of a pipe whose write end only the C side holds: its end of file means the C process is
#         gone, and this helper ends its process group (what the tool started goes with it)
#
# Protocol (one JSON object a line):
#   C -> helper, first:  {"kind": "class", "class": "pkg.mod.Cls", "config": {..}, "schema": {..}, "dir": D}
#                     or {"kind": "functions", "path": FILE, "dir": D}
#                     or {"kind": "interaction", "class": "pkg.mod.Cls", "config": {..}, "dir": D} (a verl
#                        BaseInteraction: multi_turn.interaction_config_path; worker/agent/interaction.c)
#   helper -> C:         {"ready": true, "tools": [{"name": N, "schema": {..}}], "verl": "installed" | "shim"}
#                     or {"ready": false, "error": "why"}
#   C -> helper, a call: {"op": "create" | "execute" | "calc_reward" | "release" | "call", "tool": N,
#                         "instance": ID | null, "kwargs": {..}, "args": {..}}
#   helper -> C:         {"ok": true, "text": T, "reward": R}  or  {"ok": false, "error": "Type: message"}
#   an interaction's:    "create" is start_interaction(ID, **kwargs), "release" finalize_interaction(ID) where it
#                        takes an id, and {"op": "respond", "instance": ID, "messages": [..], "kwargs": {..}} is
#                        generate_response(ID, messages, **kwargs), answered {"ok": true, "text": T, "reward": R,
#                        "terminate": B}
#
# `import verl` is tried first; where it fails, minimal stand-ins of verl.tools.base_tool, verl.tools.schemas,
# verl.tools.function_tool, verl.utils.rollout_trace and verl.interactions.base are installed under those names, so
# that a tool or interaction file written for verl imports unchanged.
import asyncio
import importlib
import importlib.util
import inspect
import json
import math
import os
import signal
import sys
import threading
import traceback
import types
import typing
import uuid

MAX_TEXT = 16 << 20  # characters of an answer sent back; the C side truncates further (max_response_length)


def last_line(e):
    """The exception as Python's last traceback line: 'ValueError: boom'."""
    lines = traceback.format_exception_only(type(e), e)
    return lines[-1].strip() if lines else type(e).__name__


# ---- the stand-ins for verl's tool modules ----

_REQUIRED = object()


class _Model:
    """A small stand-in for a pydantic model: keyword fields with defaults, attribute access, model_validate,
    model_dump (exclude_unset, exclude_none). Unknown keys are dropped, as pydantic does by default."""

    FIELDS = ()  # (name, default or _REQUIRED or a callable making one, converter or None)

    def __init__(self, **values):
        self._set = set()
        for name, default, conv in self.FIELDS:
            if name in values:
                v = values[name]
                setattr(self, name, conv(v) if conv is not None and v is not None else v)
                self._set.add(name)
            elif default is _REQUIRED:
                raise ValueError("%s: the field '%s' is required" % (type(self).__name__, name))
            else:
                setattr(self, name, default() if callable(default) else default)

    @classmethod
    def model_validate(cls, obj):
        if isinstance(obj, cls):
            return obj
        if isinstance(obj, _Model):
            obj = obj.model_dump(exclude_unset=True)
        if not isinstance(obj, dict):
            raise TypeError("%s: expected a mapping, not %s" % (cls.__name__, type(obj).__name__))
        return cls(**obj)

    def model_dump(self, exclude_unset=False, exclude_none=False, **_ignored):
        def dump(v):
            if isinstance(v, _Model):
                return v.model_dump(exclude_unset=exclude_unset, exclude_none=exclude_none)
            if isinstance(v, dict):
                return {k: dump(x) for k, x in v.items()}
            if isinstance(v, list):
                return [dump(x) for x in v]
            return v

        out = {}
        for name, _, _ in self.FIELDS:
            v = getattr(self, name)
            if (exclude_unset and name not in self._set) or (exclude_none and v is None):
                continue
            out[name] = dump(v)
        return out

    def __eq__(self, other):
        return type(self) is type(other) and self.model_dump() == other.model_dump()

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % kv for kv in self.model_dump().items()))


def _build_schemas_module():
    m = types.ModuleType("verl.tools.schemas")

    class OpenAIFunctionPropertySchema(_Model):
        FIELDS = (("type", _REQUIRED, None), ("description", None, None), ("enum", None, list))

    def props(d):
        return {k: OpenAIFunctionPropertySchema.model_validate(v) for k, v in dict(d).items()}

    class OpenAIFunctionParametersSchema(_Model):
        FIELDS = (("type", _REQUIRED, None), ("properties", dict, props), ("required", list, list))

    class OpenAIFunctionSchema(_Model):
        FIELDS = (
            ("name", _REQUIRED, str),
            ("description", "", str),
            ("parameters", lambda: OpenAIFunctionParametersSchema(type="object", properties={}, required=[]),
             OpenAIFunctionParametersSchema.model_validate),
            ("strict", False, bool),
        )

    class OpenAIFunctionToolSchema(_Model):
        FIELDS = (("type", _REQUIRED, None), ("function", _REQUIRED, OpenAIFunctionSchema.model_validate))

    class OpenAIFunctionParsedSchema(_Model):
        FIELDS = (("name", _REQUIRED, str), ("arguments", _REQUIRED, str))

    class OpenAIFunctionCallSchema(_Model):
        FIELDS = (("name", _REQUIRED, str), ("arguments", _REQUIRED, dict))

        @staticmethod
        def from_openai_function_parsed_schema(parsed):
            try:
                args = json.loads(parsed.arguments)
                bad = not isinstance(args, dict)
            except ValueError:
                args, bad = {}, True
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={} if bad else args), bad

    class OpenAIFunctionToolCall(_Model):
        FIELDS = (("id", _REQUIRED, str), ("type", "function", None),
                  ("function", _REQUIRED, OpenAIFunctionCallSchema.model_validate))

    class ToolResponse(_Model):
        FIELDS = (("text", None, None), ("image", None, None), ("video", None, None))

        def __init__(self, **values):
            for key in ("image", "video"):
                if key in values and values[key] is not None and not isinstance(values[key], list):
                    raise ValueError("ToolResponse: %s must be a list, not %s" % (key, type(values[key]).__name__))
            super().__init__(**values)

        def is_empty(self):
            return not self.text and not self.image and not self.video

        def is_text_only(self):
            return bool(self.text) and not self.image and not self.video

    for cls in (OpenAIFunctionPropertySchema, OpenAIFunctionParametersSchema, OpenAIFunctionSchema,
                OpenAIFunctionToolSchema, OpenAIFunctionParsedSchema, OpenAIFunctionCallSchema, OpenAIFunctionToolCall,
                ToolResponse):
        cls.__module__ = m.__name__
        setattr(m, cls.__name__, cls)
    return m


def _build_base_tool_module(schemas):
    m = types.ModuleType("verl.tools.base_tool")

    class BaseTool:
        """verl's tool interface: create an instance per trajectory, execute calls in it, calc_reward, release."""

        def __init__(self, config, tool_schema):
            self.config = config
            self.tool_schema = tool_schema or self.get_openai_tool_schema()
            if self.tool_schema is None:
                raise ValueError("the tool has no schema")
            self.name = self.tool_schema.function.name

        def get_openai_tool_schema(self):
            return self.tool_schema

        async def create(self, instance_id=None, **kwargs):
            return (instance_id if instance_id is not None else str(uuid.uuid4())), schemas.ToolResponse()

        async def execute(self, instance_id, parameters, **kwargs):
            return schemas.ToolResponse(text="Updated the tool state."), 0.0, {}

        async def calc_reward(self, instance_id, **kwargs):
            return 0.0

        async def release(self, instance_id, **kwargs):
            return None

    BaseTool.__module__ = m.__name__
    m.BaseTool = BaseTool
    m.OpenAIFunctionToolSchema = schemas.OpenAIFunctionToolSchema
    m.ToolResponse = schemas.ToolResponse
    return m


# -- @function_tool: the schema from the signature and the Google-style docstring (the rules of
# transformers.utils.get_json_schema, which verl uses, then verl's schema model: each property keeps type,
# description and enum) --


def _literal_type(v):
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if v is None:
        return "null"
    return "string"


def _hint_schema(hint):
    """A JSON-schema fragment for a type hint."""
    basic = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}
    if hint in basic:
        return {"type": basic[hint]}
    if hint is typing.Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        kinds = sorted({_literal_type(v) for v in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        subs = [_hint_schema(a) for a in args if a is not type(None)]
        if len(subs) == 1:
            out = dict(subs[0])
        elif all(isinstance(s.get("type"), str) for s in subs):
            out = {"type": sorted({s["type"] for s in subs})}
        else:
            out = {"anyOf": subs}
        if type(None) in args:
            out["nullable"] = True
        return out
    if hint is list or origin is list:
        return {"type": "array", "items": _hint_schema(args[0])} if args else {"type": "array"}
    if hint is tuple or origin is tuple:
        if not args:
            return {"type": "array"}
        if len(args) == 1 or Ellipsis in args:
            raise TypeError("a tuple hint of one element or with '...' has no tool schema; use list[...]")
        return {"type": "array", "prefixItems": [_hint_schema(a) for a in args]}
    if hint is dict or origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _hint_schema(args[1])
        return out
    return {"type": "object"}  # another class: an object


_SECTIONS = ("Args:", "Arguments:", "Returns:", "Return:", "Yields:", "Raises:", "Examples:", "Example:", "Note:")


def _parse_docstring(doc):
    """(description, {argument: description}) of a Google-style docstring."""
    lines = doc.split("\n")
    heads = [i for i, line in enumerate(lines) if line.strip() in _SECTIONS]
    description = "\n".join(lines[: heads[0]] if heads else lines).strip()
    args = {}
    for h, i in enumerate(heads):
        if lines[i].strip() not in ("Args:", "Arguments:"):
            continue
        body = lines[i + 1: heads[h + 1] if h + 1 < len(heads) else len(lines)]
        body = [line for line in body if line.strip()]
        if not body:
            continue
        indent = min(len(line) - len(line.lstrip()) for line in body)
        name = None
        for line in body:
            stripped = line.strip()
            head, sep, rest = stripped.partition(":")
            key = head.split("(", 1)[0].strip()  # "x (int): ..." names x too
            if len(line) - len(line.lstrip()) == indent and sep and key.isidentifier():
                name = key
                args[name] = rest.strip()
            elif name is not None:
                args[name] = (args[name] + " " + stripped).strip()
    return description, args


def _schema_from_function(fn, tool_name):
    where = "@function_tool '%s' (%s.%s)" % (tool_name, fn.__module__, fn.__qualname__)
    sig = inspect.signature(fn)
    variadic = [n for n, p in sig.parameters.items() if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if variadic:
        raise ValueError("%s: variadic parameter(s) %s cannot be expressed in a tool schema; name each parameter"
                         % (where, ", ".join(variadic)))
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise ValueError("%s has no docstring: its summary is the tool's description and its Args: block "
                         "describes each parameter" % where)
    description, arg_docs = _parse_docstring(doc.strip())
    hints = typing.get_type_hints(fn)
    properties, required = {}, []
    for name, p in sig.parameters.items():
        if p.annotation is inspect.Parameter.empty:
            raise TypeError("%s: parameter '%s' is missing a type hint" % (where, name))
        if name not in arg_docs:
            raise ValueError("%s: the docstring has no description for the argument '%s' (Args: block)"
                             % (where, name))
        frag = _hint_schema(hints.get(name, p.annotation))
        desc = arg_docs[name]
        tail = desc.rfind("(choices:")
        if tail >= 0 and desc.rstrip().endswith(")"):
            frag["enum"] = [c.strip() if isinstance(c, str) else c
                            for c in json.loads(desc[tail + len("(choices:"): desc.rstrip().rfind(")")])]
            desc = desc[:tail].strip()
        if "type" not in frag:
            raise TypeError("%s: parameter '%s' has a type a tool schema cannot state (a JSON type is needed)"
                            % (where, name))
        prop = {"type": frag["type"], "description": desc}
        if "enum" in frag:
            prop["enum"] = frag["enum"]
        properties[name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": tool_name, "description": description,
                                             "parameters": parameters}}


def _build_function_tool_module(schemas):
    m = types.ModuleType("verl.tools.function_tool")
    registry = {}
    loaded = {}

    class FunctionTool:
        """A registered function: name, fn, tool_schema, is_async."""

        def __init__(self, name, fn, tool_schema, is_async=False):
            self.name, self.fn, self.tool_schema, self.is_async = name, fn, tool_schema, is_async

        async def call(self, parameters):
            if self.is_async:
                return await self.fn(**parameters)
            return self.fn(**parameters)

    def function_tool(name=None, *, schema=None):
        def register(fn, tool_name):
            tool_name = tool_name or fn.__name__
            if schema is None:
                built = schemas.OpenAIFunctionToolSchema.model_validate(_schema_from_function(fn, tool_name))
            else:
                built = schemas.OpenAIFunctionToolSchema.model_validate(schema)
            old = registry.get(tool_name)
            if old is not None and old.fn is not fn:
                raise ValueError("function tool '%s' is already registered to %s.%s"
                                 % (tool_name, old.fn.__module__, old.fn.__qualname__))
            registry[tool_name] = FunctionTool(tool_name, fn, built, inspect.iscoroutinefunction(fn))
            return fn

        if callable(name) and schema is None:  # bare @function_tool
            return register(name, None)
        return lambda fn: register(fn, name)

    def get_function_tool(name):
        if name not in registry:
            raise KeyError("function tool '%s' is not registered" % name)
        return registry[name]

    def load_function_tools_from_path(path):
        full = os.path.abspath(path)
        if not os.path.isfile(full):
            raise FileNotFoundError("function_tool_path does not exist: %s" % path)
        if full in loaded:
            return loaded[full]
        before = set(registry)
        mod_name = "_function_tools_" + "".join(c if c.isalnum() else "_" for c in full)
        spec = importlib.util.spec_from_file_location(mod_name, full)
        if spec is None or spec.loader is None:
            raise ImportError("%s is not a Python file" % path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
        loaded[full] = [registry[n] for n in sorted(set(registry) - before)]
        return loaded[full]

    def normalize_function_tool_return(ret):
        text, reward = normalize_result(ret)
        return schemas.ToolResponse(text=text), reward, {}

    m.FUNCTION_TOOL_REGISTRY = registry
    m._LOADED_FUNCTION_TOOL_PATHS = loaded
    m.FunctionTool = FunctionTool
    m.function_tool = function_tool
    m.get_function_tool = get_function_tool
    m.load_function_tools_from_path = load_function_tools_from_path
    m.normalize_function_tool_return = normalize_function_tool_return
    m.OpenAIFunctionToolSchema = schemas.OpenAIFunctionToolSchema
    m.ToolResponse = schemas.ToolResponse
    FunctionTool.__module__ = m.__name__
    return m


def _build_interaction_base_module():
    m = types.ModuleType("verl.interactions.base")

    class BaseInteraction:
        """verl's simulated user: an instance per trajectory, a response (and a score) after each model turn."""

        def __init__(self, config):
            self.config = config
            self.name = config.get("name", "interaction_agent")

        async def start_interaction(self, instance_id=None, **kwargs):
            return instance_id if instance_id is not None else str(uuid.uuid4())

        async def generate_response(self, instance_id, messages, **kwargs):
            return False, "Your current result seems acceptable.", 0.8, {}

        async def calculate_score(self):
            return 0.0

        async def finalize_interaction(self):
            return None

    BaseInteraction.__module__ = m.__name__
    m.BaseInteraction = BaseInteraction
    return m


def install_verl_shims():
    """verl's own modules where `import verl` works; else the stand-ins. 'installed' or 'shim'."""
    try:
        import verl  # noqa: F401

        return "installed"
    except ImportError:
        pass
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
        del sys.modules[name]  # what a failed import left behind

    def package(name):
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
        return mod

    verl, tools, utils = package("verl"), package("verl.tools"), package("verl.utils")
    interactions = package("verl.interactions")
    verl.tools, verl.utils, verl.interactions = tools, utils, interactions
    schemas = _build_schemas_module()
    base_tool = _build_base_tool_module(schemas)
    function_tool = _build_function_tool_module(schemas)
    trace = types.ModuleType("verl.utils.rollout_trace")
    trace.rollout_trace_op = lambda fn: fn
    for mod, parent, attr in ((schemas, tools, "schemas"), (base_tool, tools, "base_tool"),
                              (function_tool, tools, "function_tool"), (trace, utils, "rollout_trace"),
                              (_build_interaction_base_module(), interactions, "base")):
        sys.modules[mod.__name__] = mod
        setattr(parent, attr, mod)
    return "shim"


# ---- answers ----


def response_text(v):
    """The text of a tool's response: a str as is, verl's ToolResponse its text, a dict as JSON, else str()."""
    if isinstance(v, str):
        return v
    if type(v).__name__ == "ToolResponse" and hasattr(v, "text"):
        return v.text if isinstance(v.text, str) else ("" if v.text is None else str(v.text))
    if isinstance(v, dict):
        try:
            return json.dumps(v, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(v)
    return str(v)


def normalize_result(ret):
    """(text, reward) of what execute or a function returned: a response, or (response, reward[, metrics])."""
    if isinstance(ret, tuple):
        if not 1 <= len(ret) <= 3:
            raise TypeError("the tool returned a tuple of %d items; expected (response,), (response, reward) or "
                            "(response, reward, metrics)" % len(ret))
        reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
        return response_text(ret[0]), reward
    return response_text(ret), 0.0


def clean_text(s):
    """Valid UTF-8 for the JSON line: no NUL, lone surrogates replaced, at most MAX_TEXT characters."""
    if len(s) > MAX_TEXT:
        half = MAX_TEXT // 2
        s = "%s...(%d characters dropped by the tool runner)...%s" % (s[:half], len(s) - 2 * half, s[-half:])
    return s.replace("\x00", "\ufffd").encode("utf-8", "surrogatepass").decode("utf-8", "replace")


# ---- the helper ----


def import_class(path):
    """The class at path (package.module.Class), imported; ImportError or TypeError saying what is missing."""
    mod_name, _, cls_name = path.rpartition(".")
    if not mod_name or not cls_name:
        raise ImportError("'%s' is not a class path (package.module.Class)" % path)
    mod = importlib.import_module(mod_name)
    cls = getattr(mod, cls_name, None)
    if cls is None:
        raise ImportError("module '%s' (%s) has no attribute '%s'" % (mod_name, getattr(mod, "__file__", "?"),
                                                                    cls_name))
    if not callable(cls):
        raise TypeError("'%s' is not a class" % path)
    return cls


class Helper:
    def __init__(self, spec):
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.kind = spec["kind"]
        self.instances = {}  # our instance id -> the id the tool's create returned
        self.obj, self.functions, self.tools = None, {}, []
        if self.kind == "class":
            self.load_class(spec)
        elif self.kind == "interaction":
            self.load_interaction(spec)
        else:
            self.load_functions(spec["path"])

    def run(self, v):
        return self.loop.run_until_complete(v) if inspect.isawaitable(v) else v

    def load_class(self, spec):
        path = spec["class"]
        cls = import_class(path)
        from verl.tools.schemas import OpenAIFunctionToolSchema

        self.obj = cls(config=spec["config"], tool_schema=OpenAIFunctionToolSchema.model_validate(spec["schema"]))
        for method in ("execute",):
            if not callable(getattr(self.obj, method, None)):
                raise TypeError("'%s' has no %s method (verl's BaseTool interface)" % (path, method))

    def load_interaction(self, spec):
        """verl's interaction registry builds cls(config) with the config's name in it."""
        path = spec["class"]
        self.obj = import_class(path)(dict(spec.get("config") or {}))
        if not callable(getattr(self.obj, "generate_response", None)):
            raise TypeError("'%s' has no generate_response method (verl's BaseInteraction interface)" % path)

    def interaction(self, op, inst, req):
        if op == "create":
            fn = getattr(self.obj, "start_interaction", None)
            ret = self.run(fn(inst, **(req.get("kwargs") or {}))) if callable(fn) else inst
            self.instances[inst] = ret if isinstance(ret, str) else inst
            return {}
        if op == "respond":
            if inst not in self.instances:
                self.interaction("create", inst, req)
            ret = self.run(self.obj.generate_response(self.instances[inst], req.get("messages") or [],
                                                      **(req.get("kwargs") or {})))
            if not isinstance(ret, tuple) or len(ret) < 2:
                raise TypeError("generate_response returned %s; expected (should_terminate_sequence, response, "
                                "score, metrics)" % type(ret).__name__)
            score = ret[2] if len(ret) > 2 else None
            return {"terminate": bool(ret[0]), "text": response_text(ret[1]),
                    "reward": None if score is None else float(score)}
        if op == "release":
            tid = self.instances.pop(inst, None)
            fn = getattr(self.obj, "finalize_interaction", None)
            if tid is not None and callable(fn):
                try:  # verl's base takes no id; its GSM8K interaction takes the instance's
                    takes_id = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                                   for p in inspect.signature(fn).parameters.values())
                except (TypeError, ValueError):
                    takes_id = False
                self.run(fn(tid) if takes_id else fn())
            return {}
        raise ValueError("unknown request %r for an interaction" % op)

    def load_functions(self, path):
        ft = importlib.import_module("verl.tools.function_tool")
        for tool in ft.load_function_tools_from_path(path):
            schema = tool.tool_schema
            if hasattr(schema, "model_dump"):
                schema = schema.model_dump(exclude_unset=True, exclude_none=True)
            self.functions[tool.name] = tool
            self.tools.append({"name": tool.name, "schema": schema})

    def create(self, inst, kwargs):
        kwargs = dict(kwargs or {})
        fn = self.obj.create if callable(getattr(self.obj, "create", None)) else None
        if fn is None:
            self.instances[inst] = inst
            return
        call_kwargs = dict(kwargs)
        try:
            params = inspect.signature(fn).parameters.values()
            if any(p.kind == p.VAR_KEYWORD or p.name == "create_kwargs" for p in params):
                call_kwargs.setdefault("create_kwargs", kwargs)  # verl's agent loop passes them so, the
                # sglang rollout as keywords: both
        except (TypeError, ValueError):
            pass
        ret = self.run(fn(inst, **call_kwargs))
        if isinstance(ret, tuple) and ret and isinstance(ret[0], str):
            self.instances[inst] = ret[0]
        elif isinstance(ret, str):
            self.instances[inst] = ret
        else:
            self.instances[inst] = inst

    def handle(self, req):
        op, inst = req.get("op"), req.get("instance")
        if self.kind == "interaction":
            return self.interaction(op, inst, req)
        if self.kind == "functions":
            if op in ("execute", "call"):
                tool = self.functions.get(req.get("tool"))
                if tool is None:
                    raise KeyError("no function tool '%s' in this file" % req.get("tool"))
                args = req.get("args") or {}
                ret = self.run(tool.fn(**args))
                text, reward = normalize_result(ret)
                return {"text": text, "reward": reward}
            return {"reward": 0.0}  # functions have no instances
        if op == "create":
            self.create(inst, req.get("kwargs"))
            return {}
        if op == "execute" or op == "call":
            once = op == "call" or inst is None
            if once:
                inst = "call-" + uuid.uuid4().hex
                self.create(inst, req.get("kwargs"))
            elif inst not in self.instances:
                self.create(inst, None)
            try:
                ret = self.run(self.obj.execute(self.instances[inst], req.get("args") or {}))
                text, reward = normalize_result(ret)
            finally:
                if once:
                    self.release(inst)
            return {"text": text, "reward": reward}
        if op == "calc_reward":
            fn = getattr(self.obj, "calc_reward", None)
            if not callable(fn) or inst not in self.instances:
                return {"reward": 0.0}
            r = self.run(fn(self.instances[inst]))
            try:
                return {"reward": float(r)}
            except (TypeError, ValueError):
                raise TypeError("calc_reward returned %s, not a number" % type(r).__name__) from None
        if op == "release":
            self.release(inst)
            return {}
        raise ValueError("unknown request %r" % op)

    def release(self, inst):
        tid = self.instances.pop(inst, None)
        fn = getattr(self.obj, "release", None)
        if tid is not None and callable(fn):
            self.run(fn(tid))


def main():
    sock_in = os.fdopen(3, "r", encoding="utf-8", newline="\n")
    sock_out = os.fdopen(os.dup(3), "w", encoding="utf-8", newline="\n")
    sys.stdout = sys.stderr  # what the tool prints goes to the log, never into the protocol

    def send(obj):
        if isinstance(obj.get("reward"), float) and not math.isfinite(obj["reward"]):
            print("tool runner: a reward of %r is answered as 0" % obj["reward"], file=sys.stderr)
            obj["reward"] = 0.0
        sock_out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        sock_out.flush()

    def watch_parent():
        try:
            while os.read(4, 64):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)  # the C process is gone: this helper and what its tool started end

    threading.Thread(target=watch_parent, daemon=True).start()
    spec = json.loads(sock_in.readline() or "{}")
    if sys.path and sys.path[0] in ("", "."):
        del sys.path[0]
    for d in reversed([os.getcwd(), spec.get("dir") or ""]):
        if d and d not in sys.path:
            sys.path.insert(0, d)
    try:
        verl = install_verl_shims()
        helper = Helper(spec)
    except BaseException as e:  # noqa: B036 - whatever the import does, the C side hears why
        send({"ready": False, "error": last_line(e)})
        return
    send({"ready": True, "tools": helper.tools, "verl": verl})
    for line in sock_in:
        try:
            out = helper.handle(json.loads(line))
            if "text" in out:
                out["text"] = clean_text(out["text"])
            out["ok"] = True
        except BaseException as e:  # noqa: B036 - an exception, SystemExit included, is the call's answer
            out = {"ok": False, "error": clean_text(last_line(e))}
        send(out)


main()

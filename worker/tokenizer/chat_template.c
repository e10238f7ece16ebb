/* The chat template renderer: a CPython helper running jinja2 as transformers does (chat_template.h).
 *
 * Protocol, one JSON object a line on the socket (the child's fds 3 and 4):
 *   driver -> us, once:    {"ready": true}  or  {"ready": false, "error": "why jinja2 cannot be imported"}
 *   us -> driver:          {"template": T, "messages": [..], "tools": [..] | null, "add_generation_prompt": b,
 *                           "special": {"bos_token": .., ..}, "kwargs": {..}}
 *   driver -> us:          {"text": "..."}  or  {"error": "...", "line": N | null}
 * The driver keeps the compiled templates it has seen (by their text). */
#include "worker/tokenizer/chat_template.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fs.h"
#include "common/clock.h"
#include "common/linebuf.h"
#include "common/procgroup.h"
#include "worker/tokenizer/tokenizer_internal.h"

#define CHAT_PYTHON "python3"
#define CHAT_START_S 60.0   /* for python3 to start and import jinja2 */
#define CHAT_RENDER_S 120.0 /* for one render */
#define CHAT_INSTALL "install python3-jinja2 (Debian: apt-get install python3-jinja2) or `pip install jinja2`"

/* The driver: transformers' rendering environment, written out. */
static const char DRIVER[] =
    "import json, os, sys, traceback\n"
    "from datetime import datetime\n"
    "if sys.path and sys.path[0] in ('', os.getcwd()):\n"
    "    del sys.path[0]\n"
    "rq = os.fdopen(3, 'r', encoding='utf-8')\n"
    "wr = os.fdopen(4, 'w', encoding='utf-8')\n"
    "sys.stdout = sys.stderr\n"
    "def send(o):\n"
    "    wr.write(json.dumps(o) + '\\n')\n"
    "    wr.flush()\n"
    "try:\n"
    "    import jinja2, jinja2.exceptions, jinja2.ext, jinja2.nodes, jinja2.utils\n"
    "    from jinja2.sandbox import ImmutableSandboxedEnvironment\n"
    "except Exception as e:\n"
    "    send({'ready': False, 'error': '%s: %s' % (type(e).__name__, e)})\n"
    "    sys.exit(0)\n"
    /* {% generation %}..{% endgeneration %}: transformers tracks the assistant's span with it; the text is the
     * body's */
    "class Generation(jinja2.ext.Extension):\n"
    "    tags = {'generation'}\n"
    "    def parse(self, parser):\n"
    "        lineno = next(parser.stream).lineno\n"
    "        body = parser.parse_statements(['name:endgeneration'], drop_needle=True)\n"
    "        return jinja2.nodes.CallBlock(self.call_method('_body'), [], [], body).set_lineno(lineno)\n"
    "    def _body(self, caller):\n"
    "        return caller()\n"
    /* namespace() without underscore-prefixed attributes; dict() without its class's attributes */
    "def no_dunder(name):\n"
    "    if isinstance(name, str) and name.startswith('_'):\n"
    "        raise jinja2.exceptions.SecurityError('a namespace attribute may not start with an underscore: %r' % "
    "name)\n"
    "class Namespace(jinja2.utils.Namespace):\n"
    "    def __init__(*args, **kwargs):\n"
    "        attrs = dict(*args[1:], **kwargs)\n"
    "        for name in attrs:\n"
    "            no_dunder(name)\n"
    "        jinja2.utils.Namespace.__init__(args[0], attrs)\n"
    "    def __setitem__(self, name, value):\n"
    "        no_dunder(name)\n"
    "        jinja2.utils.Namespace.__setitem__(self, name, value)\n"
    "class Dict:\n"
    "    def __call__(self, *args, **kwargs):\n"
    "        return dict(*args, **kwargs)\n"
    "    def fromkeys(self, *args, **kwargs):\n"
    "        return dict.fromkeys(*args, **kwargs)\n"
    "class Raised(jinja2.exceptions.TemplateError):\n"
    "    pass\n"
    "def raise_exception(message):\n"
    "    raise Raised(message)\n"
    "def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):\n"
    "    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)\n"
    "def strftime_now(fmt):\n"
    "    return datetime.now().strftime(fmt)\n"
    "env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,\n"
    "                                    extensions=[Generation, jinja2.ext.loopcontrols])\n"
    "env.filters['tojson'] = tojson\n"
    "env.globals['raise_exception'] = raise_exception\n"
    "env.globals['strftime_now'] = strftime_now\n"
    "env.globals['dict'] = Dict()\n"
    "env.globals['namespace'] = Namespace\n"
    "compiled = {}\n"
    "def template(text):\n"
    "    t = compiled.get(text)\n"
    "    if t is None:\n"
    "        if len(compiled) >= 8:\n"
    "            compiled.clear()\n"
    "        t = compiled[text] = env.from_string(text)\n"
    "    return t\n"
    /* a message: keys whose value is null dropped; its reasoning under reasoning_content, and under thinking too
     * (first), whichever of reasoning_content, thinking, reasoning carried it */
    "REASONING = ('reasoning_content', 'thinking', 'reasoning')\n"
    "def message(i, m):\n"
    "    if not isinstance(m, dict):\n"
    "        raise TypeError('message %d is not an object' % i)\n"
    "    m = {k: v for k, v in m.items() if v is not None}\n"
    "    r = next((m[k] for k in REASONING if m.get(k) is not None), None)\n"
    "    if r is not None:\n"
    "        m = {'thinking': r, **m, 'reasoning_content': r}\n"
    "    return m\n"
    "def line_of(e):\n"
    "    if isinstance(e, jinja2.exceptions.TemplateSyntaxError):\n"
    "        return e.lineno\n"
    "    n = None\n"
    "    for f in traceback.extract_tb(e.__traceback__):\n"
    "        if f.filename == '<template>':\n"
    "            n = f.lineno\n"
    "    return n\n"
    "def what(e):\n"
    "    if isinstance(e, jinja2.exceptions.TemplateSyntaxError):\n"
    "        return 'syntax error: %s' % e.message\n"
    "    if isinstance(e, Raised):\n"
    "        return 'raise_exception: %s' % e\n"
    "    return '%s: %s' % (type(e).__name__, e)\n"
    "send({'ready': True})\n"
    "for line in rq:\n"
    "    try:\n"
    "        q = json.loads(line)\n"
    "        tpl = template(q['template'])\n"
    "        tools = q.get('tools')\n"
    "        if tools is not None and not (isinstance(tools, list) and all(isinstance(x, dict) for x in tools)):\n"
    "            raise ValueError('tools must be a list of JSON schemas (objects)')\n"
    "        kwargs = dict(q.get('special') or {})\n"
    "        kwargs.update(q.get('kwargs') or {})\n"
    "        documents = kwargs.pop('documents', None)\n"
    "        if documents is not None and not (isinstance(documents, list) and all(isinstance(d, dict) for d in "
    "documents)):\n"
    "            raise TypeError('documents must be a list of objects (title, text)')\n"
    "        msgs = [message(i, m) for i, m in enumerate(q['messages'])]\n"
    "        text = tpl.render(messages=msgs, tools=tools, documents=documents,\n"
    "                          add_generation_prompt=bool(q.get('add_generation_prompt')), **kwargs)\n"
    "        send({'text': text})\n"
    "    except Exception as e:\n"
    "        send({'error': what(e), 'line': line_of(e)})\n";

struct chat_renderer {
    pthread_mutex_t lock;
    pid_t pid;         /* 0 when no helper runs */
    int fd;            /* our end of the socket, -1 when none */
    struct linebuf lb; /* what the helper wrote, taken as lines */
};

struct chat_renderer *chat_renderer_new(void)
{
    struct chat_renderer *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->lock, NULL);
    r->fd = -1;
    return r;
}

/* End the helper: close the socket (the driver's loop ends), give it a moment, then end its process group. */
static void stop(struct chat_renderer *r, bool kill_now)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    linebuf_reset(&r->lb);
    if (r->pid > 0)
        procgroup_end(r->pid, kill_now ? 0 : 2.0);
    r->pid = 0;
}

void chat_renderer_free(struct chat_renderer *r)
{
    if (!r)
        return;
    stop(r, false);
    linebuf_free(&r->lb);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/* How the helper ended, for an error (reaps it). */
static int ended(struct chat_renderer *r, char *err, size_t errlen)
{
    const pid_t pid = r->pid;
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    linebuf_reset(&r->lb);
    r->pid = 0;
    const int st = pid > 0 ? procgroup_end(pid, 2.0) : 0; /* it closed its end: it is exiting */
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        return error_set(err, errlen,
                         "chat template: cannot run %s (see the log): prompts are rendered by Python's jinja2; "
                         "install python3 and python3-jinja2",
                         CHAT_PYTHON);
    if (WIFSIGNALED(st)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        return error_set(err, errlen, "chat template: the %s renderer was killed by SIG%s", CHAT_PYTHON,
                         abbrev ? abbrev : "?");
    }
    return error_set(err, errlen, "chat template: the %s renderer exited (status %d; its reason is in the log)",
                     CHAT_PYTHON, WEXITSTATUS(st));
}

/* The next line from the helper by `deadline`: 1 with *line (valid until the next call), 0 on the deadline, -1 when
 * the helper is gone. */
static int read_line(struct chat_renderer *r, double deadline, char **line)
{
    return linebuf_read(&r->lb, r->fd, deadline, line);
}

/* Start the helper and read its ready line. 0, or -1 with err. */
static int start(struct chat_renderer *r, char *err, size_t errlen)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return error_set(err, errlen, "chat template: cannot create a socket: %s", strerror(errno));
    fflush(NULL);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]), close(sv[1]);
        return error_set(err, errlen, "chat template: cannot start %s: %s", CHAT_PYTHON, strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own group, ended with it */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(111);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        const int s = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
        if (s < 0 || dup2(s, 3) < 0 || dup2(s, 4) < 0 || dup2(2, 1) < 0)
            _exit(112);
        const int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
#ifdef SYS_close_range
        syscall(SYS_close_range, 5u, ~0u, 0u);
#endif
        execlp(CHAT_PYTHON, CHAT_PYTHON, "-c", DRIVER, (char *)NULL);
        fprintf(stderr, "chat template: cannot run %s: %s\n", CHAT_PYTHON, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* as the child does, whichever runs first */
    close(sv[1]);
    r->pid = pid;
    r->fd = sv[0];
    linebuf_reset(&r->lb);
    char *line;
    const int rc = read_line(r, clock_now_s() + CHAT_START_S, &line);
    if (rc == 0) {
        stop(r, true);
        return error_set(err, errlen, "chat template: %s did not start within %.0f s", CHAT_PYTHON, CHAT_START_S);
    }
    if (rc < 0)
        return ended(r, err, errlen);
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const int ok = json_is_true(json_object_get(o, "ready"));
    if (!ok) {
        const char *why = json_string_value(json_object_get(o, "error"));
        error_set(err, errlen, "chat template: %s cannot import jinja2 (%s): " CHAT_INSTALL, CHAT_PYTHON,
                  why ? why : "no reason given");
        stop(r, true);
    }
    json_decref(o);
    return ok ? 0 : -1;
}

/* Write all of text. 0, or -1 when the helper is gone. */
static int send_all(int fd, const char *text, size_t len) { return fs_write_full(fd, text, len); }

/* One request line, one result line. NULL with err. */
static char *render_locked(struct chat_renderer *r, const char *request, size_t len, char *err, size_t errlen)
{
    for (int attempt = 0;; attempt++) {
        if (r->pid <= 0 && start(r, err, errlen) != 0)
            return NULL;
        char *line = NULL;
        int rc = send_all(r->fd, request, len) == 0 ? read_line(r, clock_now_s() + CHAT_RENDER_S, &line) : -1;
        if (rc == 0) {
            stop(r, true);
            error_set(err, errlen, "chat template: no result within %.0f s (the renderer was stopped)", CHAT_RENDER_S);
            return NULL;
        }
        if (rc < 0) {
            ended(r, err, errlen);
            if (attempt == 0)
                continue; /* it may have ended with the thread that started it: once more with a fresh one */
            return NULL;
        }
        json_error_t je;
        json_t *o = json_loads(line, JSON_ALLOW_NUL, &je);
        const json_t *text = json_object_get(o, "text"), *e = json_object_get(o, "error");
        char *out = NULL;
        if (json_is_string(text)) {
            out = xstrdup(json_string_value(text));
        } else if (json_is_string(e)) {
            const json_t *ln = json_object_get(o, "line");
            if (json_is_integer(ln))
                error_set(err, errlen, "chat template line %lld: %s", (long long)json_integer_value(ln),
                          json_string_value(e));
            else
                error_set(err, errlen, "chat template: %s", json_string_value(e));
        } else {
            stop(r, true);
            error_set(err, errlen, "chat template: the renderer's answer is not understood (protocol error)");
        }
        json_decref(o);
        return out;
    }
}

/* The named special tokens transformers passes to every template. */
static json_t *special_tokens(const struct tokenizer *t)
{
    json_t *o = json_object();
    const struct {
        const char *name;
        int32_t id;
    } named[] = {
        {"bos_token", t->bos_id}, {"eos_token", t->eos_id}, {"unk_token", t->cfg_unk_id}, {"pad_token", t->pad_id}};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
        const char *s = named[i].id >= 0 ? tokenizer_token_text(t, named[i].id) : NULL;
        json_t *v = s ? json_string(s) : NULL;
        if (v)
            json_object_set_new(o, named[i].name, v);
    }
    return o;
}

/* ChatML from each message's role and content, for a tokenizer without a template. */
static char *chatml(const json_t *messages, bool add_generation_prompt)
{
    size_t cap = 64, n = 0, i;
    const json_t *m;
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        cap += strlen(role ? role : "") + strlen(content ? content : "") + 32;
    }
    char *out = xmalloc(cap);
    out[0] = '\0';
    json_array_foreach(messages, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        n += (size_t)snprintf(out + n, cap - n, "<|im_start|>%s\n%s<|im_end|>\n", role ? role : "",
                              content ? content : "");
    }
    if (add_generation_prompt)
        snprintf(out + n, cap - n, "<|im_start|>assistant\n");
    return out;
}

/* The common path: messages, tools (or NULL) and kwargs (or NULL) as JSON values. */
static char *render(const struct tokenizer *t, json_t *messages, json_t *tools, bool add_generation_prompt,
                    json_t *kwargs, char *err, size_t errlen)
{
    if (json_array_size(messages) == 0) {
        error_set(err, errlen, "chat template: no messages to render (an empty conversation)");
        return NULL;
    }
    if (!t->chat_template)
        return chatml(messages, add_generation_prompt);
    json_t *kw = json_object();
    if (t->chat_kwargs)
        json_object_update(kw, t->chat_kwargs);
    if (kwargs)
        json_object_update(kw, kwargs);
    json_t *tpl = json_string(t->chat_template);
    if (!tpl) {
        json_decref(kw);
        error_set(err, errlen, "chat template: the template is not valid UTF-8");
        return NULL;
    }
    json_t *req = json_pack("{s:o, s:O, s:O, s:b, s:o, s:o}", "template", tpl, "messages", messages, "tools",
                            tools ? tools : json_null(), "add_generation_prompt", add_generation_prompt, "special",
                            special_tokens(t), "kwargs", kw);
    char *text = req ? json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_ENCODE_ANY) : NULL;
    json_decref(req);
    if (!text) {
        error_set(err, errlen, "chat template: cannot encode the request");
        return NULL;
    }
    const size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len] = '\n';
    text[len + 1] = '\0';
    struct chat_renderer *r = t->chat;
    pthread_mutex_lock(&r->lock);
    char *out = render_locked(r, text, len + 1, err, errlen);
    pthread_mutex_unlock(&r->lock);
    free(text);
    return out;
}

/* A JSON text of the given kind (what names it in errors). NULL with err. */
static json_t *parse(const char *s, bool want_array, const char *what, char *err, size_t errlen)
{
    json_error_t je;
    json_t *v = json_loads(s, JSON_DECODE_ANY, &je);
    if (!v) {
        error_set(err, errlen, "%s: not valid JSON: %s (line %d, column %d)", what, je.text, je.line, je.column);
        return NULL;
    }
    if (want_array ? !json_is_array(v) : !json_is_object(v)) {
        json_decref(v);
        error_set(err, errlen, "%s: not a JSON %s", what, want_array ? "array" : "object");
        return NULL;
    }
    return v;
}

char *tokenizer_render_chat(const struct tokenizer *t, const char *messages_json, const char *tools_json,
                            bool add_generation_prompt, const char *kwargs_json, char *err, size_t errlen)
{
    json_t *messages = parse(messages_json ? messages_json : "", true, "messages", err, errlen);
    json_t *tools = NULL, *kwargs = NULL;
    char *out = NULL;
    if (messages && (!tools_json || (tools = parse(tools_json, true, "tools", err, errlen))) &&
        (!kwargs_json || (kwargs = parse(kwargs_json, false, "chat template kwargs", err, errlen))))
        out = render(t, messages, tools, add_generation_prompt, kwargs, err, errlen);
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return out;
}

char *tokenizer_apply_chat_template(const struct tokenizer *t, const struct chat_message *msgs, int n,
                                    bool add_generation_prompt, char *err, size_t errlen)
{
    json_t *messages = json_array();
    for (int i = 0; i < n; i++) {
        json_t *m = json_object();
        json_t *role = json_string(msgs[i].role ? msgs[i].role : "");
        json_t *content = msgs[i].content ? json_string(msgs[i].content) : NULL;
        if (!role || (msgs[i].content && !content)) {
            json_decref(role), json_decref(content), json_decref(m), json_decref(messages);
            error_set(err, errlen, "chat template: message %d is not valid UTF-8", i);
            return NULL;
        }
        json_object_set_new(m, "role", role);
        if (content) /* transformers drops a key whose value is None */
            json_object_set_new(m, "content", content);
        json_array_append_new(messages, m);
    }
    char *out = render(t, messages, NULL, add_generation_prompt, NULL, err, errlen);
    json_decref(messages);
    return out;
}

int tokenizer_set_chat_kwargs(struct tokenizer *t, const char *kwargs_json, char *err, size_t errlen)
{
    json_t *kw = NULL;
    if (kwargs_json && !(kw = parse(kwargs_json, false, "chat template kwargs", err, errlen)))
        return -1;
    json_decref(t->chat_kwargs);
    t->chat_kwargs = kw;
    return 0;
}

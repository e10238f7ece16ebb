/* grpo-model: model utilities. info, convert, tokenize, chat, logits, generate, plan; tool (one tool call). */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker/agent/agent_loop.h"
#include "common/check.h"
#include "common/fs.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "common/npy.h"
#include "worker/agent/tool.h"
#include "worker/formats/gguf.h"
#include "worker/formats/safetensors.h"
#include "worker/model/model_generate.h"
#include "worker/model/lora.h"
#include "worker/model/model_io.h"
#include "worker/plan/planner.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/step/prompts.h"
#include "worker/tokenizer/tokenizer.h"

static void usage(FILE *out)
{
    fputs("usage: grpo-model COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  info MODEL                         architecture, sizes, parameter count, tensor dtypes, and a LoRA\n"
          "                                     adapter (MODEL: a PEFT adapter directory, or a model with one)\n"
          "  init CONFIG.json OUTDIR --tokenizer-from MODEL [--seed S] [--std X]\n"
          "                                     a randomly initialised model (tests, experiments)\n"
          "  convert IN.gguf OUTDIR [--bf16]    GGUF to Hugging Face layout (config.json, model.safetensors,\n"
          "                                     tokenizer.json, tokenizer_config.json)\n"
          "  merge-lora MODEL ADAPTER OUTDIR    a PEFT LoRA adapter merged into MODEL's weights (W + alpha/r B A)\n"
          "  tokenize MODEL TEXT [--chat]       token ids of TEXT, comma-separated on one line\n"
          "  chat MODEL --messages FILE.json [--tools FILE.json] [--no-generation-prompt] [--kwargs JSON] [--ids]\n"
          "                                     the messages rendered by the model's chat template, exactly\n"
          "  logits MODEL --ids 1,2,3 --out F.npy [--adapter LORA_DIR]\n"
          "                                     float32 [T, vocab] logits of every position, NumPy format\n"
          "  generate MODEL --prompt TEXT [--chat] [--max-new-tokens N] [--temperature T] [--top-p P]\n"
          "                 [--top-k K] [--seed S] [-n SAMPLES]\n"
          "                                     sample a continuation (temperature 0: greedy)\n"
          "  plan CONFIG.json [cluster and batch options]\n"
          "                                     memory and communication of every parallel layout, and the\n"
          "                                     recommended one (grpo-model plan --help)\n"
          "  tool [--tool-config FILE] [--function-tool-path FILE] NAME --args JSON [--max-response-length N]\n"
          "       [--truncate-side S]\n"
          "                                     one tool call as a rollout makes it (built-ins: code_interpreter,\n"
          "                                     calculator); prints the text the model would see\n"
          "\n"
          "MODEL is a Hugging Face model directory or a .gguf file. `grpo-model COMMAND --help` for details.\n"
          "Common options: --threads N (OpenBLAS threads, default 1).\n",
          out);
}

static const char CHAT_HELP[] =
    "usage: grpo-model chat MODEL --messages FILE.json [--tools FILE.json] [--no-generation-prompt]\n"
    "                        [--kwargs JSON] [--ids]\n"
    "  Render the messages (a JSON array of {\"role\", \"content\", ...}) with MODEL's chat template, as\n"
    "  transformers' apply_chat_template does, and print the text exactly (no newline added); --ids prints\n"
    "  its token ids instead, comma-separated. --tools: a JSON array of tool schemas. --kwargs: a JSON object\n"
    "  of extra template variables, e.g. '{\"enable_thinking\": false}' or '{\"date_string\": \"26 Jul 2024\"}'.\n"
    "  The generation prompt is added unless --no-generation-prompt. The template runs in python3's jinja2.\n";

static const char *const cmd_help[][2] = {
    {"info", "usage: grpo-model info MODEL\n  Print architecture, hyper-parameters, parameter count and the dtypes of "
             "the stored tensors.\n  MODEL may be a PEFT LoRA adapter directory (adapter_config.json): its rank, "
             "alpha and target\n  modules, then its base model (base_model_name_or_path) when that is at hand.\n"},
    {"merge-lora", "usage: grpo-model merge-lora MODEL ADAPTER OUTDIR\n  Fold the PEFT LoRA adapter in ADAPTER "
                   "(adapter_config.json, adapter_model.safetensors) into\n  MODEL's weights, W + lora_alpha / r B A, "
                   "and write a plain checkpoint (config.json,\n  model.safetensors F32, MODEL's tokenizer) into "
                   "OUTDIR.\n"},
    {"init", "usage: grpo-model init CONFIG.json OUTDIR --tokenizer-from MODEL [--seed S] [--std X]\n  Write a model "
             "with the architecture of CONFIG.json (transformers' keys) and random weights:\n  normal(0, std) "
             "matrices (default std 0.02), unit norms, zero biases; the tokenizer is copied\n  from MODEL (a "
             "directory or .gguf), whose vocabulary must match vocab_size.\n"},
    {"convert", "usage: grpo-model convert IN.gguf OUTDIR [--bf16]\n  Import a GGUF file (llama or qwen2) and write "
                "the Hugging Face layout into OUTDIR:\n  config.json, generation_config.json, model.safetensors (F32, "
                "or BF16 with --bf16),\n  tokenizer.json and tokenizer_config.json (with the chat template).\n"},
    {"tokenize", "usage: grpo-model tokenize MODEL TEXT [--chat]\n  Print the token ids of TEXT, comma-separated. "
                 "With --chat, TEXT is a user message\n  wrapped in the model's chat template with a generation "
                 "prompt.\n"},
    {"logits", "usage: grpo-model logits MODEL --ids 1,2,3 --out FILE.npy [--adapter LORA_DIR]\n  Run the model "
               "(with the PEFT LoRA adapter in LORA_DIR) on the ids and write the float32\n  [T, vocab] logits of "
               "every position.\n"},
    {"generate", "usage: grpo-model generate MODEL --prompt TEXT [--chat] [--max-new-tokens N] [--temperature T]\n"
                 "                          [--top-p P] [--top-k K] [--seed S] [-n SAMPLES]\n"
                 "  Sample continuations of TEXT (defaults: 64 tokens, temperature 0 = greedy, top-p 1, seed 1).\n"
                 "  Prints each sample's text; --ids prints the token ids and log-probs too.\n"},
};

struct opts {
    const char *ids, *out, *prompt, *tokenizer_from, *adapter;
    double std;
    int chat, bf16, max_new, top_k, n, threads, print_ids;
    float temperature, top_p;
    unsigned long long seed;
};

static int model_is_gguf(const char *path)
{
    size_t n = strlen(path);
    return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

/* The model's tokenizer, as a run loads it (with tokenizer_config.json's or chat_template.jinja's template). */
static struct tokenizer *load_tokenizer(const char *model)
{
    char err[1024];
    struct tokenizer *t = prompt_load_tokenizer(model, NULL, NULL, err, sizeof err);
    if (!t)
        log_error("model", "%s", err);
    return t;
}

/* The prompt as ids: raw text, or a user turn in the chat template. NULL (logged) when the template fails. */
static int32_t *prompt_ids(const struct tokenizer *t, const char *text, int chat, size_t *n)
{
    if (!chat)
        return tokenizer_encode(t, text, strlen(text), 0, n);
    struct chat_message msg = {"user", text};
    char err[1024];
    char *s = tokenizer_apply_chat_template(t, &msg, 1, true, err, sizeof err);
    if (!s) {
        log_error("model", "%s", err);
        return NULL;
    }
    int32_t *ids = tokenizer_encode(t, s, strlen(s), 0, n);
    free(s);
    return ids;
}

/* A PEFT LoRA adapter in dir (adapter_config.json): print it; *base gets the directory of its base model (dir
 * itself when it holds config.json, else base_model_name_or_path, relative to dir when relative; "" when none
 * is here). Returns 1 when there is an adapter, 0 when not, -1 on a bad one. */
static int print_adapter(const char *dir, char *base, size_t len)
{
    char path[8300], err[1024], name[4096], targets[128];
    snprintf(base, len, "%s", dir);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (access(path, R_OK) != 0)
        return 0;
    struct lora_config c = {0};
    if (lora_read_config(dir, &c, name, sizeof name, err, sizeof err) != 0) {
        log_error("model", "%s", err);
        return -1;
    }
    printf("LoRA adapter        rank %d, alpha %g (scale %g), on %s%s\n", c.rank, c.alpha, c.alpha / c.rank,
           lora_targets_text(c.targets, targets, sizeof targets), c.router ? " and the router" : "");
    printf("adapter base model  %s\n", name[0] ? name : "(not named)");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) == 0)
        return 1;
    if (name[0] == '/')
        snprintf(base, len, "%s", name);
    else
        snprintf(base, len, "%s/%s", dir, name);
    snprintf(path, sizeof path, "%s/config.json", base);
    if (!name[0] || access(path, R_OK) != 0)
        base[0] = 0;
    return 1;
}

static int cmd_info(const char *arg)
{
    char err[1024], base[8200];
    const int adapter = print_adapter(arg, base, sizeof base);
    if (adapter < 0)
        return 1;
    if (adapter && !base[0])
        return 0; /* the adapter alone: its base model is not at hand */
    const char *path = adapter ? base : arg;
    struct model *m = model_load(path, err, sizeof err);
    if (!m) {
        log_error("model", "%s", err);
        return 1;
    }
    const struct model_config *c = &m->cfg;
    const struct model_arch_info *fam = model_arch_info(c->arch);
    printf("architecture        %s (family %s)\n", fam->hf_class, fam->model_type);
    printf("layers              %d\n", c->n_layers);
    printf("hidden_size         %d\n", c->hidden_size);
    printf("intermediate_size   %d\n", c->intermediate_size);
    printf("attention heads     %d (key/value heads %d, head_dim %d)\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("vocab_size          %d\n", c->vocab_size);
    printf("rope_theta          %g\n", c->rope_theta);
    if (c->rope.kind == ROPE_LLAMA3)
        printf("rope scaling        llama3 (factor %g, low_freq_factor %g, high_freq_factor %g, "
               "original_max_position_embeddings %d)\n",
               c->rope.factor, c->rope.low_freq_factor, c->rope.high_freq_factor,
               c->rope.original_max_position_embeddings);
    else if (c->rope.kind == ROPE_LINEAR)
        printf("rope scaling        linear (factor %g)\n", c->rope.factor);
    else
        printf("rope scaling        none (default)\n");
    printf("q/k norms           %s\n", c->qk_norm ? "per head (Qwen3)" : "none");
    if (c->n_experts)
        printf("experts             %d of %d rows each, %d per token (%s), every layer\n", c->n_experts,
               c->moe_intermediate, c->n_experts_per_tok,
               c->norm_topk_prob ? "chosen probabilities renormalised" : "softmax probabilities as they are");
    printf("rms_norm_eps        %g\n", c->rms_norm_eps);
    printf("tie_word_embeddings %s\n", c->tie_word_embeddings ? "true" : "false");
    printf("q/k/v bias          %s\n", c->attention_bias ? "true" : "false");
    printf("context length      %d\n", c->max_position_embeddings);
    printf("bos/eos token ids   %d / %d\n", c->bos_token_id, c->eos_token_id);
    printf("parameters          %zu (%.1f M)\n", model_num_params(m), model_num_params(m) / 1e6);
    if (adapter) {
        if (lora_load(m, arg, err, sizeof err) != 0) {
            log_error("model", "%s", err);
            model_free(m);
            return 1;
        }
        printf("adapter parameters  %zu (%.3f%% of the base)\n", m->lora->n,
               100.0 * (double)m->lora->n / (double)model_num_params(m));
    }
    char kern[256];
    printf("kernels             %s\n", khost_blas_kernels(kern, sizeof kern));
    /* stored dtypes, counted per tensor */
    int counts[64] = {0};
    const char *names[64] = {0};
    if (model_is_gguf(path)) {
        struct gguf_file *g = gguf_open(path, err, sizeof err);
        for (int i = 0; g && i < gguf_num_tensors(g); i++) {
            uint32_t ty = gguf_tensor(g, i)->type;
            if (ty < 64) {
                counts[ty]++;
                names[ty] = gguf_type_name(ty);
            }
        }
        gguf_close(g);
    } else {
        struct st_model *st = st_model_open(path, err, sizeof err);
        for (int i = 0; st && i < st_model_num_tensors(st); i++) {
            enum st_dtype dt = st_model_tensor(st, i, NULL)->dtype;
            counts[dt]++;
            names[dt] = st_dtype_name(dt);
        }
        st_model_close(st);
    }
    printf("tensor dtypes      ");
    for (int i = 0; i < 64; i++)
        if (counts[i])
            printf(" %s x%d", names[i], counts[i]);
    printf("\n");
    model_free(m);
    return 0;
}

/* OUTDIR and its parents, as mkdir -p: a fresh checkout's runs/ or ~/.cache/ tree need not exist yet. */
static int make_outdir(const char *cmd, const char *outdir)
{
    if (fs_mkdir_p(outdir) != 0) {
        log_error(cmd, "cannot create directory %s: %s", outdir, check_errno_text());
        return -1;
    }
    return 0;
}

/* m (config.json, model.safetensors) and tokenizer t (NULL: none) into outdir (created): what the loader reads.
 * 0, or -1 (logged under cmd). */
static int save_model_dir(const char *cmd, const struct model *m, const struct tokenizer *t, const char *outdir,
                          int bf16)
{
    char err[1024], path[4096];
    if (make_outdir(cmd, outdir) != 0)
        return -1;
    int rc = model_save_hf(m, outdir, bf16, err, sizeof err);
    snprintf(path, sizeof path, "%s/tokenizer.json", outdir);
    if (rc == 0 && t)
        rc = tokenizer_save_json(t, path, err, sizeof err);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", outdir);
    if (rc == 0 && t)
        rc = tokenizer_save_config_json(t, path, err, sizeof err);
    if (rc != 0)
        log_error(cmd, "%s", err);
    return rc;
}

static int cmd_convert(const char *in, const char *outdir, int bf16)
{
    char err[1024];
    struct model *m = model_load_gguf(in, err, sizeof err);
    if (!m) {
        log_error("convert", "%s", err);
        return 1;
    }
    struct tokenizer *t = load_tokenizer(in);
    if (!t) {
        model_free(m);
        return 1;
    }
    int rc = 1;
    if (save_model_dir("convert", m, t, outdir, bf16) != 0)
        goto out;
    log_info("convert", "%s -> %s (%zu parameters, %s)", in, outdir, model_num_params(m), bf16 ? "bf16" : "f32");
    rc = 0;
out:
    tokenizer_free(t);
    model_free(m);
    return rc;
}

static int cmd_init(const char *config, const char *outdir, const struct opts *o)
{
    char err[1024];
    if (!o->tokenizer_from) {
        log_error("init", "needs --tokenizer-from MODEL");
        return 2;
    }
    struct model_config cfg;
    if (model_config_from_hf_json(config, &cfg, err, sizeof err) != 0) {
        log_error("init", "%s", err);
        return 2;
    }
    struct tokenizer *t = load_tokenizer(o->tokenizer_from);
    if (!t)
        return 1;
    if (tokenizer_vocab_size(t) > cfg.vocab_size) {
        log_error("init", "the tokenizer of %s has %d tokens; %s has vocab_size %d", o->tokenizer_from,
                  tokenizer_vocab_size(t), config, cfg.vocab_size);
        tokenizer_free(t);
        return 2;
    }
    char why[512];
    if (model_config_check_fits(&cfg, why, sizeof why) != 0) {
        log_error("init", "%s: %s", config, why);
        tokenizer_free(t);
        return 2;
    }
    struct model *m = model_create(&cfg);
    model_init_random(m, o->seed, o->std);
    int rc = 1;
    if (save_model_dir("init", m, t, outdir, 0) != 0)
        goto out;
    log_info("init", "%s: %zu parameters, seed %llu, std %g", outdir, model_num_params(m), o->seed, o->std);
    rc = 0;
out:
    model_free(m);
    tokenizer_free(t);
    return rc;
}

/* The merged export: BASE with the adapter in ADAPTER folded into its weights (W + alpha / r B A), a plain
 * checkpoint with BASE's tokenizer. */
static int cmd_merge_lora(const char *basedir, const char *adapter, const char *outdir)
{
    char err[1024];
    struct model *m = model_load(basedir, err, sizeof err);
    if (!m || lora_load(m, adapter, err, sizeof err) != 0) {
        log_error("merge-lora", "%s", err);
        model_free(m);
        return 1;
    }
    char tok[4200];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", basedir);
    const bool has_tok = model_is_gguf(basedir) || access(tok, R_OK) == 0;
    struct tokenizer *t = has_tok ? load_tokenizer(basedir) : NULL; /* a bare test model may have none */
    int rc = 1;
    char targets[128];
    const int rank = m->lora->cfg.rank;
    const double alpha = m->lora->cfg.alpha;
    lora_targets_text(m->lora->cfg.targets, targets, sizeof targets);
    lora_merge(m);
    if ((t || !has_tok) && save_model_dir("merge-lora", m, t, outdir, 0) == 0) {
        log_info("merge-lora", "%s + %s (rank %d, alpha %g, on %s) -> %s", basedir, adapter, rank, alpha, targets,
                 outdir);
        rc = 0;
    }
    if (t)
        tokenizer_free(t);
    model_free(m);
    return rc;
}

static int cmd_tokenize(const char *model, const char *text, int chat)
{
    struct tokenizer *t = load_tokenizer(model);
    if (!t)
        return 1;
    size_t n;
    int32_t *ids = prompt_ids(t, text, chat, &n);
    if (!ids) {
        tokenizer_free(t);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? "," : "", ids[i]);
    printf("\n");
    free(ids);
    tokenizer_free(t);
    return 0;
}

/* A whole file as a string (malloc'd), or NULL (logged). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        log_error("chat", "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *s = xmalloc(cap);
    for (size_t k; (k = fread(s + n, 1, cap - n - 1, f)) > 0;) {
        n += k;
        if (cap - n < 2)
            s = xrealloc(s, cap *= 2);
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        log_error("chat", "%s: cannot read", path);
        free(s);
        return NULL;
    }
    s[n] = '\0';
    return s;
}

/* grpo-model chat MODEL --messages FILE [--tools FILE] [--no-generation-prompt] [--kwargs JSON] [--ids] */
static int chat_main(int argc, char **argv)
{
    const char *messages = NULL, *tools = NULL, *kwargs = NULL;
    int no_gen = 0, ids = 0, c;
    static const struct option lopts[] = {{"messages", required_argument, 0, 'm'},
                                          {"tools", required_argument, 0, 't'},
                                          {"kwargs", required_argument, 0, 'k'},
                                          {"no-generation-prompt", no_argument, 0, 'G'},
                                          {"ids", no_argument, 0, 'i'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        switch (c) {
        case 'm': messages = optarg; break;
        case 't': tools = optarg; break;
        case 'k': kwargs = optarg; break;
        case 'G': no_gen = 1; break;
        case 'i': ids = 1; break;
        case 'h': fputs(CHAT_HELP, stdout); return 0;
        default: fputs(CHAT_HELP, stderr); return 2;
        }
    }
    if (argc - optind != 1 || !messages) {
        log_error("chat", argc - optind != 1 ? "chat takes one MODEL" : "chat needs --messages FILE.json");
        fputs(CHAT_HELP, stderr);
        return 2;
    }
    char *mtext = slurp(messages), *ttext = tools ? slurp(tools) : NULL;
    if (!mtext || (tools && !ttext)) {
        free(mtext), free(ttext);
        return 1;
    }
    int rc = 1;
    struct tokenizer *t = load_tokenizer(argv[optind]);
    if (t) {
        char err[2048];
        char *text = tokenizer_render_chat(t, mtext, ttext, !no_gen, kwargs, err, sizeof err);
        if (!text) {
            log_error("chat", "%s", err);
        } else if (ids) {
            size_t n;
            int32_t *v = tokenizer_encode(t, text, strlen(text), 0, &n);
            for (size_t i = 0; i < n; i++)
                printf("%s%d", i ? "," : "", v[i]);
            printf("\n");
            free(v);
            rc = 0;
        } else {
            fwrite(text, 1, strlen(text), stdout);
            rc = fflush(stdout) == 0 ? 0 : 1;
        }
        free(text);
        tokenizer_free(t);
    }
    free(mtext), free(ttext);
    return rc;
}

static const char TOOL_HELP[] =
    "usage: grpo-model tool [--tool-config FILE] [--function-tool-path FILE.py] NAME --args JSON\n"
    "                       [--max-response-length N] [--truncate-side left|right|middle] [--create-kwargs JSON]\n"
    "                       [--show-reward]\n"
    "  Run one call of the tool NAME exactly as a rollout would (the arguments checked against the tool's\n"
    "  schema, the tool run, a long answer truncated) and print the text the model would see, with no newline\n"
    "  added. Built-in tools: code_interpreter (argument code: Python source, run in a sandbox with no network,\n"
    "  a private empty directory and time, memory, process and output limits) and calculator (argument\n"
    "  expression: exact integer and decimal arithmetic). --tool-config: verl's tool-config YAML\n"
    "  (tools: [{class_name, config, tool_schema}]; a class that is not built in is a Python class\n"
    "  package.module.Class) and --function-tool-path: a Python file of verl @function_tool functions; either or\n"
    "  both replace the built-ins; docs/tools.md lists the classes and config keys. The call runs in a trajectory\n"
    "  of its own: the tool's instance is created (with --create-kwargs, a JSON object), called, and released;\n"
    "  --show-reward writes the step reward and calc_reward's to stderr. --max-response-length (characters; 0:\n"
    "  no limit; default 256 or the config's) and --truncate-side (default middle) are verl's\n"
    "  max_tool_response_length and tool_response_truncate_side.\n"
    "  Exit status: 0 when the tool answered, an error message included; 1 when the tool config or the function\n"
    "  file cannot be read, or the instance cannot be created; 2 for a usage error (an unknown tool, arguments\n"
    "  that are not JSON).\n";

/* grpo-model tool [--tool-config FILE] [--function-tool-path FILE] NAME --args JSON [--max-response-length N]
 * [--truncate-side S] [--create-kwargs JSON] [--show-reward] */
static int tool_main(int argc, char **argv)
{
    const char *config = NULL, *fpath = NULL, *args = NULL, *side = NULL, *maxlen = NULL, *ckw = NULL;
    int c, show_reward = 0;
    static const struct option lopts[] = {{"tool-config", required_argument, 0, 'c'},
                                          {"function-tool-path", required_argument, 0, 'f'},
                                          {"args", required_argument, 0, 'a'},
                                          {"max-response-length", required_argument, 0, 'm'},
                                          {"truncate-side", required_argument, 0, 's'},
                                          {"create-kwargs", required_argument, 0, 'k'},
                                          {"show-reward", no_argument, 0, 'r'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
        switch (c) {
        case 'c': config = optarg; break;
        case 'f': fpath = optarg; break;
        case 'a': args = optarg; break;
        case 'm': maxlen = optarg; break;
        case 's': side = optarg; break;
        case 'k': ckw = optarg; break;
        case 'r': show_reward = 1; break;
        case 'h': fputs(TOOL_HELP, stdout); return 0;
        default: fputs(TOOL_HELP, stderr); return 2;
        }
    }
    if (argc - optind != 1 || !args) {
        log_error("tool", argc - optind != 1 ? "tool takes one NAME" : "tool needs --args JSON");
        fputs(TOOL_HELP, stderr);
        return 2;
    }
    const char *name = argv[optind];
    json_error_t je;
    json_t *a = json_loads(args, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!a) {
        log_error("tool", "--args is not JSON: %s (column %d)", je.text, je.column);
        return 2;
    }
    json_t *kw = ckw ? json_loads(ckw, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (ckw && !json_is_object(kw)) {
        log_error("tool", "--create-kwargs is not a JSON object%s%s", kw ? "" : ": ", kw ? "" : je.text);
        json_decref(kw);
        json_decref(a);
        return 2;
    }
    long long max = -1;
    int sd = -1;
    char *end = NULL;
    if (maxlen && ((max = strtoll(maxlen, &end, 10)) < 0 || *end || end == maxlen)) {
        log_error("tool", "--max-response-length '%s': a number of characters >= 0", maxlen);
        json_decref(a), json_decref(kw);
        return 2;
    }
    if (side && (sd = tool_truncate_side_from_name(side)) < 0) {
        log_error("tool", "--truncate-side '%s': left, right or middle", side);
        json_decref(a), json_decref(kw);
        return 2;
    }
    struct tool_set set = {0};
    char err[2048];
    struct tool *t = NULL;
    if (config || fpath) {
        if ((config && tool_set_load_yaml(&set, config, err, sizeof err) != 0) ||
            (fpath && tool_set_load_function_tools(&set, fpath, err, sizeof err) != 0)) {
            log_error("tool", "%s", err);
            tool_set_free(&set);
            json_decref(a), json_decref(kw);
            return 1;
        }
        t = tool_set_find(&set, name);
    } else { /* only the built-in asked for: a calculator call starts no sandbox probe */
        const char *names = tool_builtin_names();
        const size_t n = strlen(name);
        for (const char *p = strstr(names, name); p && !t; p = strstr(p + 1, name))
            if ((p == names || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0')) {
                if (!(t = tool_builtin_new(name, err, sizeof err))) {
                    log_error("tool", "%s", err);
                    json_decref(a), json_decref(kw);
                    return 1;
                }
                tool_set_add(&set, t);
            }
    }
    if (!t) {
        char *names = config || fpath ? tool_set_names(&set) : xstrdup(tool_builtin_names());
        log_error("tool", "unknown tool '%s' (known: %s)", name, names[0] ? names : "none");
        free(names);
        tool_set_free(&set);
        json_decref(a), json_decref(kw);
        return 2;
    }
    if (max >= 0)
        t->max_response_length = (size_t)max;
    if (sd >= 0)
        t->truncate_side = (enum tool_truncate_side)sd;
    /* a trajectory of its own, as the agent loop makes one */
    const char *instance = "grpo-model-tool";
    if (tool_create(t, instance, kw, err, sizeof err) != 0) {
        log_error("tool", "%s", err);
        tool_set_free(&set);
        json_decref(a), json_decref(kw);
        return 1;
    }
    double step_reward = 0;
    int is_error = 0;
    char *text = tool_call_json_in(t, instance, a, &step_reward, &is_error);
    const double reward = tool_calc_reward(t, instance);
    tool_release(t, instance);
    fwrite(text, 1, strlen(text), stdout);
    const int rc = fflush(stdout) == 0 ? 0 : 1;
    if (show_reward)
        fprintf(stderr, "step reward %.17g, calc_reward %.17g%s\n", step_reward, reward,
                is_error ? " (an error answer)" : "");
    free(text);
    tool_set_free(&set);
    json_decref(a), json_decref(kw);
    return rc;
}

/* "1,2,3" -> ids; -1 on a malformed list */
static int parse_ids(const char *s, int32_t **ids, int *n)
{
    int cap = 16;
    *ids = xmalloc((size_t)cap * sizeof **ids);
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff)
            return -1;
        if (*n == cap)
            *ids = xrealloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

static int cmd_logits(const char *model, const struct opts *o)
{
    if (!o->ids || !o->out) {
        log_error("logits", "needs --ids 1,2,3 and --out FILE.npy");
        return 2;
    }
    int32_t *ids;
    int T;
    if (parse_ids(o->ids, &ids, &T) != 0) {
        log_error("logits", "--ids '%s' is not a comma-separated list of token ids", o->ids);
        free(ids);
        return 2;
    }
    char err[1024];
    struct model *m = model_load(model, err, sizeof err);
    if (!m || (o->adapter && lora_load(m, o->adapter, err, sizeof err) != 0)) {
        log_error("logits", "%s", err);
        model_free(m);
        free(ids);
        return 1;
    }
    for (int i = 0; i < T; i++)
        if (ids[i] >= m->cfg.vocab_size) {
            log_error("logits", "token id %d at position %d is outside the vocabulary (size %d)", ids[i], i,
                      m->cfg.vocab_size);
            model_free(m);
            free(ids);
            return 2;
        }
    float *logits = xmalloc((size_t)T * m->cfg.vocab_size * sizeof(float));
    model_logits(m, ids, T, logits);
    int64_t shape[2] = {T, m->cfg.vocab_size};
    int rc = npy_write_f32(o->out, logits, shape, 2, err, sizeof err);
    if (rc != 0)
        log_error("logits", "%s", err);
    free(logits);
    free(ids);
    model_free(m);
    return rc ? 1 : 0;
}

static int cmd_generate(const char *model, const struct opts *o)
{
    if (!o->prompt) {
        log_error("generate", "needs --prompt TEXT");
        return 2;
    }
    char err[1024];
    struct tokenizer *t = load_tokenizer(model);
    if (!t)
        return 1;
    struct model *m = model_load(model, err, sizeof err);
    if (!m) {
        log_error("generate", "%s", err);
        tokenizer_free(t);
        return 1;
    }
    size_t n;
    int32_t *ids = prompt_ids(t, o->prompt, o->chat, &n);
    if (!ids) {
        model_free(m);
        tokenizer_free(t);
        return 1;
    }
    int plen = (int)n;
    int32_t stops[2];
    int n_stop = 0;
    if (tokenizer_eos_id(t) >= 0)
        stops[n_stop++] = tokenizer_eos_id(t);
    int im_end = tokenizer_token_id(t, "<|im_end|>");
    if (im_end >= 0 && (n_stop == 0 || im_end != stops[0]))
        stops[n_stop++] = im_end;
    struct gen_params gp = {
        .sampling = {o->temperature, o->top_p, o->top_k},
        .max_new_tokens = o->max_new,
        .n_samples = o->n,
        .max_batch = o->n,
        .stop_ids = stops,
        .n_stop = n_stop,
        .seed = o->seed,
    };
    struct gen_output *out = xcalloc((size_t)o->n, sizeof *out);
    const int32_t *prompts[1] = {ids};
    model_generate(m, prompts, &plen, 1, &gp, out);
    for (int s = 0; s < o->n; s++) {
        char *text = tokenizer_decode(t, out[s].tokens, (size_t)out[s].len, true);
        if (o->n > 1)
            printf("--- sample %d (%d tokens%s)\n", s, out[s].len, out[s].stopped ? ", stopped" : "");
        printf("%s\n", text);
        if (o->print_ids) {
            for (int i = 0; i < out[s].len; i++)
                printf("%s%d:%.4f", i ? " " : "# ", out[s].tokens[i], out[s].logps[i]);
            printf("\n");
        }
        free(text);
        model_gen_output_free(&out[s]);
    }
    free(out);
    free(ids);
    model_free(m);
    tokenizer_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    log_init_from_env();
    gen_turn_env_register(&agent_env_factory);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "plan") == 0) /* the layout planner has options of its own */
        return plan_main(argc - 1, argv + 1);
    if (strcmp(cmd, "chat") == 0) /* so does chat (its --ids is a flag) */
        return chat_main(argc - 1, argv + 1);
    if (strcmp(cmd, "tool") == 0) /* so does tool */
        return tool_main(argc - 1, argv + 1);
    const char *help = NULL;
    for (size_t i = 0; i < sizeof cmd_help / sizeof *cmd_help; i++)
        if (strcmp(cmd, cmd_help[i][0]) == 0)
            help = cmd_help[i][1];
    if (!help) {
        log_error(
            "model",
            "unknown command '%s' (info, init, convert, merge-lora, tokenize, chat, logits, generate, plan, tool)",
            cmd);
        return 2;
    }
    struct opts o = {.max_new = 64, .top_p = 1.0f, .n = 1, .seed = 1, .threads = 1, .std = 0.02};
    static const struct option lopts[] = {{"ids", required_argument, 0, 'i'},
                                          {"out", required_argument, 0, 'o'},
                                          {"prompt", required_argument, 0, 'p'},
                                          {"chat", no_argument, 0, 'c'},
                                          {"bf16", no_argument, 0, 'b'},
                                          {"max-new-tokens", required_argument, 0, 'm'},
                                          {"temperature", required_argument, 0, 't'},
                                          {"top-p", required_argument, 0, 'P'},
                                          {"top-k", required_argument, 0, 'k'},
                                          {"seed", required_argument, 0, 's'},
                                          {"threads", required_argument, 0, 'T'},
                                          {"print-ids", no_argument, 0, 'I'},
                                          {"tokenizer-from", required_argument, 0, 'F'},
                                          {"std", required_argument, 0, 'S'},
                                          {"adapter", required_argument, 0, 'A'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    optind = 2;
    while ((c = getopt_long(argc, argv, "n:h", lopts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'i': o.ids = optarg; break;
        case 'o': o.out = optarg; break;
        case 'p': o.prompt = optarg; break;
        case 'c': o.chat = 1; break;
        case 'b': o.bf16 = 1; break;
        case 'I': o.print_ids = 1; break;
        case 'F': o.tokenizer_from = optarg; break;
        case 'A': o.adapter = optarg; break;
        case 'S': o.std = strtod(optarg, &end); break;
        case 'm': o.max_new = (int)strtol(optarg, &end, 10); break;
        case 't': o.temperature = strtof(optarg, &end); break;
        case 'P': o.top_p = strtof(optarg, &end); break;
        case 'k': o.top_k = (int)strtol(optarg, &end, 10); break;
        case 's': o.seed = strtoull(optarg, &end, 10); break;
        case 'n': o.n = (int)strtol(optarg, &end, 10); break;
        case 'T': o.threads = (int)strtol(optarg, &end, 10); break;
        case 'h': fputs(help, stdout); return 0;
        default: fputs(help, stderr); return 2;
        }
        if (end && (*end || end == optarg)) {
            log_error("model", "option value '%s' is not a number", optarg);
            return 2;
        }
    }
    if (o.n < 1 || o.max_new < 0 || o.temperature < 0 || o.top_p <= 0 || o.top_p > 1 || o.threads < 1) {
        log_error("model", "out-of-range option: need -n >= 1, --max-new-tokens >= 0, --temperature >= 0, "
                           "0 < --top-p <= 1, --threads >= 1");
        return 2;
    }
    khost_set_threads(o.threads);
    int npos = argc - optind;
    const char *a0 = npos > 0 ? argv[optind] : NULL, *a1 = npos > 1 ? argv[optind + 1] : NULL;
    int need = strcmp(cmd, "merge-lora") == 0                                                              ? 3
               : (strcmp(cmd, "convert") == 0 || strcmp(cmd, "tokenize") == 0 || strcmp(cmd, "init") == 0) ? 2
                                                                                                           : 1;
    if (npos != need) {
        log_error("model", "%s takes %d argument(s), got %d", cmd, need, npos);
        fputs(help, stderr);
        return 2;
    }
    if (strcmp(cmd, "info") == 0)
        return cmd_info(a0);
    if (strcmp(cmd, "merge-lora") == 0)
        return cmd_merge_lora(a0, a1, argv[optind + 2]);
    if (strcmp(cmd, "convert") == 0)
        return cmd_convert(a0, a1, o.bf16);
    if (strcmp(cmd, "init") == 0)
        return cmd_init(a0, a1, &o);
    if (strcmp(cmd, "tokenize") == 0)
        return cmd_tokenize(a0, a1, o.chat);
    if (strcmp(cmd, "logits") == 0)
        return cmd_logits(a0, &o);
    return cmd_generate(a0, &o);
}

/* The command-line part of the configuration shared by every binary. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "log.h"

static void drop_args(int *argc, char **argv, int at, int count)
{
    for (int j = at; j + count <= *argc; j++)
        argv[j] = argv[j + count];
    *argc -= count;
}

/* An override looks like a.b=value: a key name (letters, digits, '_', '.', '-', leading '+', and the '@' of Hydra's
 * group@package=choice) then '='; or Hydra's ~a.b (delete: back to the default), with or without a value. */
static bool looks_like_override(const char *a)
{
    if (a[0] == '~' && a[1] && a[1] != '/')
        return true;
    const char *eq = strchr(a, '=');
    if (!eq || eq == a || a[0] == '-')
        return false;
    for (const char *p = a; p < eq; p++)
        if (!(*p == '.' || *p == '_' || *p == '-' || *p == '+' || *p == '@' || (*p >= '0' && *p <= '9') ||
              ((*p | 32) >= 'a' && (*p | 32) <= 'z')))
            return false;
    return true;
}

/* Whether argv[i] may be the value of the option before it ("--tp 2"): that option is a long or short option
 * without '=' other than the ones handled here. */
static bool option_value(char **argv, int i)
{
    const char *prev = i > 1 ? argv[i - 1] : NULL;
    if (!prev || prev[0] != '-' || prev[1] == 0 || strchr(prev, '='))
        return false;
    return strcmp(prev, "--print-config") != 0 && strcmp(prev, "--config-reference") != 0;
}

int config_from_args(struct grpo_config *c, int *argc, char **argv)
{
    struct cfg_error err;
    bool print = false, reference = false;
    /* config files first, so that overrides win whatever their position */
    for (int i = 1; i < *argc;) {
        const char *a = argv[i];
        if (!a)
            break;
        const char *file = NULL;
        int used = 0;
        if ((strcmp(a, "--config") == 0 || strcmp(a, "-c") == 0)) {
            if (i + 1 >= *argc) {
                log_error("config", "%s needs a file name", a);
                return -1;
            }
            file = argv[i + 1];
            used = 2;
        } else if (strncmp(a, "--config=", 9) == 0) {
            file = a + 9;
            used = 1;
        }
        /* Hydra's --config-name / --config-path, as verl's scripts give them: the config's defaults before any
         * override, as Hydra takes them */
        const char *hydra[] = {"--config-name", "--config-path"};
        for (int h = 0; h < 2 && !file; h++) {
            const size_t hn = strlen(hydra[h]);
            const char *value = NULL;
            if (strcmp(a, hydra[h]) == 0 && i + 1 < *argc)
                value = argv[i + 1], used = 2;
            else if (strncmp(a, hydra[h], hn) == 0 && a[hn] == '=')
                value = a + hn + 1, used = 1;
            if (!value)
                continue;
            if (config_hydra_option(c, hydra[h], value, &err) != 0) {
                log_error("config", "%s", err.msg);
                return -1;
            }
            break;
        }
        if (!file && used > 0) {
            drop_args(argc, argv, i, used);
            continue;
        }
        if (!file) {
            i++;
            continue;
        }
        if (config_load_yaml(c, file, &err) != 0) {
            log_error("config", "%s", err.msg);
            return -1;
        }
        drop_args(argc, argv, i, used);
    }
    const char *stray = NULL; /* first argument that is neither an option nor an override (nor an option's value) */
    for (int i = 1; i < *argc;) {
        const char *a = argv[i];
        if (!a)
            break;
        if (!stray && a[0] != '-' && !looks_like_override(a) && !option_value(argv, i))
            stray = a;
        if (strcmp(a, "--print-config") == 0) {
            print = true;
            drop_args(argc, argv, i, 1);
        } else if (strcmp(a, "--config-reference") == 0) {
            reference = true;
            drop_args(argc, argv, i, 1);
        } else if (looks_like_override(a)) {
            char del[512];
            if (a[0] == '~' && !strchr(a, '=')) { /* ~key: the override's form with the name alone */
                snprintf(del, sizeof del, "%s=", a);
                a = del;
            }
            if (config_apply_override(c, a, &err) != 0) {
                log_error("config", "%s", err.msg);
                return -1;
            }
            drop_args(argc, argv, i, 1);
        } else {
            i++;
        }
    }
    /* --print-config and --config-reference end the program, so the caller never sees what is left: a word
     * without '=' there is a mistyped override (or a forgotten value) and must not pass silently */
    if ((print || reference) && stray) {
        log_error("config", "command line: '%s' is not a key=value override (with %s nothing else is expected)", stray,
                  print ? "--print-config" : "--config-reference");
        return -1;
    }
    if (reference) {
        config_print_reference(stdout);
        return 1;
    }
    if (config_resolve(c, &err) != 0 || config_validate(c, &err) != 0) {
        log_error("config", "%s", err.msg);
        return -1;
    }
    int level = log_level_from_name(c->trainer_log_level);
    if (level >= 0)
        log_set_level((enum log_level)level);
    log_init_from_env();            /* the environment wins over the file, as operators expect */
    if (c->n_noted > 0 && !print) { /* one line, so that nothing is silently ignored */
        char line[4096] = "";
        size_t n = 0;
        for (int i = 0; i < c->n_noted && n + 8 < sizeof line; i++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", i ? "; " : "", c->noted[i]);
        log_info("config", "%d verl key(s) accepted with no effect here: %s", c->n_noted, line);
    }
    if (print) {
        config_print(c, stdout);
        return 1;
    }
    return 0;
}

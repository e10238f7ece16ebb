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

/* An override looks like a.b=value: a key name (letters, digits, '_', '.', '-', leading '+') then '='. */
static bool looks_like_override(const char *a)
{
    const char *eq = strchr(a, '=');
    if (!eq || eq == a || a[0] == '-')
        return false;
    for (const char *p = a; p < eq; p++)
        if (!(*p == '.' || *p == '_' || *p == '-' || *p == '+' || (*p >= '0' && *p <= '9') ||
              ((*p | 32) >= 'a' && (*p | 32) <= 'z')))
            return false;
    return true;
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
    for (int i = 1; i < *argc;) {
        const char *a = argv[i];
        if (!a)
            break;
        if (strcmp(a, "--print-config") == 0) {
            print = true;
            drop_args(argc, argv, i, 1);
        } else if (strcmp(a, "--config-reference") == 0) {
            reference = true;
            drop_args(argc, argv, i, 1);
        } else if (looks_like_override(a)) {
            if (config_apply_override(c, a, &err) != 0) {
                log_error("config", "%s", err.msg);
                return -1;
            }
            drop_args(argc, argv, i, 1);
        } else {
            i++;
        }
    }
    if (reference) {
        config_print_reference(stdout);
        return 1;
    }
    if (config_validate(c, &err) != 0) {
        log_error("config", "%s", err.msg);
        return -1;
    }
    int level = log_level_from_name(c->trainer_log_level);
    if (level >= 0)
        log_set_level((enum log_level)level);
    log_init_from_env(); /* the environment wins over the file, as operators expect */
    if (print) {
        config_print(c, stdout);
        return 1;
    }
    return 0;
}

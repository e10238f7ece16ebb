/* grpo-worker --replace-rank: the run's configuration from grpod, taken into this process's. See control.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "control.h"
#include "proto/protocol.h"
#include "proto/transport.h"

/* The shared secret an endpoint needs (tcp://: grpod.secret_file's; ipc://: none). 0, or -1 with err. */
static int endpoint_secret(const struct grpo_config *cfg, char *secret, size_t len, char *err, size_t errlen)
{
    enum endpoint_kind kind;
    secret[0] = 0;
    if (endpoint_parse(cfg->grpod_endpoint, &kind, NULL, 0, err, errlen) != 0)
        return -1;
    if (kind != ENDPOINT_TCP)
        return 0;
    if (!cfg->grpod_secret_file || !cfg->grpod_secret_file[0])
        return error_set(err, errlen,
                         "grpod endpoint %s is tcp://: " KEY_grpod_secret_file " must name the shared secret",
                         cfg->grpod_endpoint);
    return secret_read(cfg->grpod_secret_file, secret, len, err, errlen);
}

/* The run's configuration text from grpod (caller frees) and the run's id. NULL with err. */
static char *fetch(const struct grpo_config *cfg, char *run_id, size_t idlen, char *err, size_t errlen)
{
    char secret[GRPO_SECRET_MAX + 1];
    if (endpoint_secret(cfg, secret, sizeof secret, err, errlen) != 0)
        return NULL;
    struct rpc_client *rpc = rpc_open(cfg->grpod_endpoint, secret, err, errlen);
    if (!rpc)
        return NULL;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply = NULL;
    env.body_case = GRPO__ENVELOPE__BODY_RUN_CONFIG_REQUEST;
    env.run_config_request = true;
    char why[1024];
    char *text = NULL;
    enum rpc_result r = rpc_call_retry(rpc, &env, 10, 2000, &reply, why, sizeof why);
    if (r != RPC_OK)
        snprintf(err, errlen, "cannot ask grpod at %s for the run's configuration: %s", cfg->grpod_endpoint, why);
    else if (reply->body_case == GRPO__ENVELOPE__BODY_RUN_CONFIG && reply->run_config->config[0]) {
        text = xstrdup(reply->run_config->config);
        snprintf(run_id, idlen, "%s", reply->run_config->run_id);
    } else if (reply->body_case == GRPO__ENVELOPE__BODY_REPLY && !reply->reply->ok)
        snprintf(err, errlen, "grpod at %s: %s", cfg->grpod_endpoint, reply->reply->error);
    else
        snprintf(err, errlen,
                 "grpod at %s answered the request for the run's configuration with '%s' (an older grpod?)",
                 cfg->grpod_endpoint, protocol_body_name(reply->body_case));
    protocol_free(reply);
    rpc_close(rpc);
    return text;
}

int control_adopt_run_config(struct grpo_config *cfg, char *err, size_t errlen)
{
    char run_id[64] = "";
    char *text = fetch(cfg, run_id, sizeof run_id, err, errlen);
    if (!text)
        return -1;
    char *given = config_run_text(cfg, CONFIG_TEXT_GIVEN), diff[1024], origin[96];
    int n = config_text_diff(given, "given here", text, "run", true, 3, diff, sizeof diff);
    int rc = 0;
    if (n) {
        rc = error_set(err, errlen,
                       "this process was given %d key(s) that differ from run %s's: %s; give a replacement "
                       "only " KEY_grpod_endpoint " (and " KEY_grpod_secret_file
                       "): it takes the run's configuration from grpod",
                       n, run_id, diff);
    } else {
        snprintf(origin, sizeof origin, "run %s (from grpod)", run_id);
        rc = config_apply_run_text(cfg, text, (size_t)1 << 20, origin, err, errlen);
        if (rc == 0)
            log_info("control", "took run %s's configuration from grpod at %s", run_id, cfg->grpod_endpoint);
    }
    free(given);
    free(text);
    return rc;
}

/* data_stranger ENDPOINT: play a stranger on a trainer's data socket. Sends, one request each: random bytes, a
 * truncated envelope, a rollout batch that names a prompt the run does not have, a rollout batch of another
 * protocol version, a control message, and one message over the size limit. A trainer must refuse (and count)
 * every one with an answer that says why, and carry on. Exit 0 when each of the first five got a refusal (the
 * oversized one is dropped by the socket, unanswered). */
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/protocol.h"

/* Send one request; with answer, wait for the trainer's answer and require a refusal. */
static int request(int s, const void *buf, size_t len, const char *what, int answer)
{
    int timeout = 20000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout, sizeof timeout);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout, sizeof timeout);
    if (nn_send(s, buf, len, 0) < 0) {
        fprintf(stderr, "data_stranger: sending %s: %s\n", what, nn_strerror(nn_errno()));
        return 1;
    }
    if (!answer)
        return 0;
    void *msg;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    if (n < 0) {
        fprintf(stderr, "data_stranger: no answer to %s: %s\n", what, nn_strerror(nn_errno()));
        return 1;
    }
    Grpo__Envelope *env = protocol_unpack(msg, (size_t)n, NULL, 0);
    nn_freemsg(msg);
    int bad = !env || env->body_case != GRPO__ENVELOPE__BODY_REPLY || env->reply->ok;
    printf("%s: %s\n", what, bad ? "NOT REFUSED" : env->reply->error);
    if (env)
        protocol_free(env);
    return bad;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: data_stranger ENDPOINT\n");
        return 2;
    }
    int s = nn_socket(AF_SP, NN_REQ);
    if (s < 0 || nn_connect(s, argv[1]) < 0) {
        fprintf(stderr, "data_stranger: %s: %s\n", argv[1], nn_strerror(nn_errno()));
        return 2;
    }
    int bad = 0;
    unsigned char junk[200];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)(i * 131 + 7);
    bad += request(s, junk, sizeof junk, "random bytes", 1);

    Grpo__Sequence q = GRPO__SEQUENCE__INIT, *qs[1] = {&q};
    int32_t ids[3] = {1, 2, 3};
    float lp[3] = {-1, -1, -1};
    q.uid = 1000000; /* no such prompt */
    q.n_prompt_ids = 3, q.prompt_ids = ids;
    q.n_response_ids = 3, q.response_ids = ids;
    q.n_old_log_probs = 3, q.old_log_probs = lp;
    Grpo__RolloutBatch rb = GRPO__ROLLOUT_BATCH__INIT;
    rb.step = 1, rb.seq_no = 1, rb.from_rank = 1, rb.n_sequences = 1, rb.sequences = qs;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_ROLLOUT;
    env.rollout = &rb;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    bad += request(s, buf, len / 2, "a truncated envelope", 1);
    bad += request(s, buf, len, "a batch naming an unknown prompt", 1);
    env.version = GRPO_PROTOCOL_VERSION + 1;
    len = grpo__envelope__get_packed_size(&env);
    free(buf);
    buf = malloc(len);
    if (!buf)
        return 2;
    grpo__envelope__pack(&env, buf);
    bad += request(s, buf, len, "a batch of another protocol version", 1);
    free(buf);
    Grpo__Envelope hb = GRPO__ENVELOPE__INIT;
    hb.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    hb.status_request = 1;
    buf = protocol_pack(&hb, &len);
    bad += request(s, buf, len, "a control message", 1);
    free(buf);
    size_t big = (size_t)GRPO_MAX_MESSAGE_BYTES + 1024;
    unsigned char *huge = calloc(1, big);
    bad += request(s, huge, big, "an oversized message", 0);
    free(huge);
    sleep(1); /* let the queue drain before the socket closes */
    nn_close(s);
    return bad ? 1 : 0;
}

/* AdamW with decoupled weight decay (torch.optim.AdamW semantics), learning
 * rate warm-up then constant or cosine schedule (verl's), and clipping by the
 * global gradient norm. State is one flat buffer per moment, matching the
 * model's single parameter buffer, so checkpoints and all-reduces are one call. */
#ifndef GRPO_WORKER_OPTIM_H
#define GRPO_WORKER_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kctx;

/* A copy of the parameters and both moments as they are before the next step changes them, made by that step
 * (trainer.survive_trainer_loss keeps each training step's start this way): chunk by chunk, each chunk copied just
 * before it is updated, so the copy reads memory the update reads anyway (host memory only). On a GPU the copy is
 * made beside the device's work instead (k_to_host_behind into pinned host memory): issued by adamw_keep_issue (by
 * the next step at the latest), and the next step's kernels wait for it. */
struct adamw_keep {
    float *p, *m, *v;    /* n floats each, where the copy goes */
    bool armed;          /* the next step makes the copy */
    bool beside;         /* on a GPU: the copy is still to be issued beside the device's work */
    bool kept;           /* made (or issued): p, m and v hold the values from before the next step */
    struct kctx *behind; /* issued on that context and not yet waited for by a step */
};

struct adamw {
    struct kctx *K; /* where the moments live and the step runs (kernels/kernels.h) */
    size_t n;
    float *m, *v; /* first and second moments (n) */
    int64_t t;    /* optimizer steps taken */
    double beta1, beta2, eps, weight_decay;
    struct adamw_keep *keep; /* armed: the next step's copy (adamw_step clears it once made; NULL: none) */
};

/* On the CPU context. */
struct adamw *adamw_create(size_t n, double beta1, double beta2, double eps, double weight_decay);
/* On context K (the model's: params and grads given to adamw_step are K's memory). */
struct adamw *adamw_create_on(struct kctx *K, size_t n, double beta1, double beta2, double eps, double weight_decay);
void adamw_free(struct adamw *o);
/* o->keep's copy beside o's device's work (keep.beside), of params (o->n floats, o's context's) and the moments as
 * they are now: issued, if it was still to be (a step no longer changes them before it waits for the copy). */
void adamw_keep_issue(struct adamw *o, const float *params);
/* One step on params (n) with grads (n) at learning rate lr; with o->keep armed (host memory), the copy first; with
 * a copy beside the device's work, after that copy. */
void adamw_step(struct adamw *o, float *params, const float *grads, double lr);
/* n floats from src to dst, dst written past the caches (the copy is read back only if a step is redone). */
void adamw_copy_out(float *dst, const float *src, size_t n);

/* Global L2 norm of grads (n), computed in double. */
double grad_global_norm(const float *grads, size_t n);
/* Clip to max_norm (<= 0: no clipping) as torch.nn.utils.clip_grad_norm_ does; returns the norm before
 * clipping. A non-finite norm leaves grads untouched (the caller skips the step). */
double grad_clip(float *grads, size_t n, double max_norm);

/* Scale grads (n), whose global norm (over every rank's part) is norm, as grad_clip does. */
void grad_scale_to(float *grads, size_t n, double norm, double max_norm);
/* grad_clip and grad_scale_to on gradients in context K's memory. */
double grad_clip_on(struct kctx *K, float *grads, size_t n, double max_norm);
void grad_scale_to_on(struct kctx *K, float *grads, size_t n, double norm, double max_norm);

/* The learning-rate schedule: verl's FSDP schedulers (constant, cosine) and Megatron's OptimizerParamScheduler
 * (constant, linear, cosine, inverse-square-root, WSD), which agree where both have a style. */
enum lr_style { LR_CONSTANT, LR_COSINE, LR_LINEAR, LR_INV_SQRT, LR_WSD };
enum lr_wsd_style { LR_WSD_EXPONENTIAL, LR_WSD_LINEAR, LR_WSD_COSINE, LR_WSD_MINUS_SQRT };
struct lr_schedule {
    enum lr_style style;
    enum lr_wsd_style wsd_style; /* WSD's anneal */
    double lr;                   /* the peak */
    double init_lr;              /* warm-up's start */
    double min_lr;               /* the floor once decayed */
    int64_t warmup;              /* linear warm-up steps */
    int64_t decay_steps;         /* the decay ends here (Megatron's lr_decay_steps; the run's steps by default) */
    int64_t wsd_steps;           /* WSD: the anneal's last steps before decay_steps */
};

/* Learning rate at optimizer step `step` (0-based: the first update is step 0). Warm-up: steps 0..warmup rise
 * linearly from init_lr to lr; then constant stays at lr; the others fall from lr at warmup to min_lr at
 * decay_steps (linear, cosine; inverse-square-root: lr * sqrt(warmup / step), not below min_lr; WSD: lr until its
 * anneal, then down to min_lr over wsd_steps) and stay at min_lr past it. */
double lr_at(const struct lr_schedule *s, int64_t step);
/* The style named by a config value (warmup_style / lr_scheduler_type / lr_decay_style), -1 if none. */
int lr_style_named(const char *name);
int lr_wsd_style_named(const char *name);

#endif

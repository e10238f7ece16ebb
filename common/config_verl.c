/* verl's keys that are not keys of ours (config_keys.def): each is either accepted and noted (it only steers
 * verl's Python machinery: Ray, FSDP, vLLM/SGLang, torch.compile...), or refused because it asks for a feature
 * we do not have yet, with the feature named. Some are accepted for the values that mean "off" and refused for
 * the others (reward_model.enable=false, trainer.critic_warmup=0). A key in neither list stays an unknown key,
 * with a suggestion. docs/verl.md gives the same table for people. */
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#include "config.h"

struct verl_key {
    const char *pattern; /* a dotted name, a prefix ending in ".*", or a name prefix ending in "*" (optim.muon_*) */
    const char *ok;      /* '|'-separated values accepted (and noted); NULL: any value */
    const char *noted;   /* why an accepted value changes nothing here (NULL: never accepted) */
    const char *refused; /* the feature other values ask for (NULL: never refused) */
};

#define NOTED(p, why)                                                                                                  \
    {                                                                                                                  \
        p, NULL, why, NULL                                                                                             \
    }
#define REFUSED(p, feature)                                                                                            \
    {                                                                                                                  \
        p, NULL, NULL, feature                                                                                         \
    }
#define OFF_ONLY(p, values, why, feature)                                                                              \
    {                                                                                                                  \
        p, values, why, feature                                                                                        \
    }

static const char FSDP[] = "verl's FSDP wrapping; the trainers' layout is the megatron.* keys here";
static const char ENGINE[] = "it tunes vLLM/SGLang; generation runs in this engine (KV cache sized by max_num_seqs)";
static const char PADDING[] = "sequences are always packed without padding here";
static const char TORCH[] = "a PyTorch option; the kernels here are C (and CUDA, planned)";
static const char RAY[] = "there is no Ray: ranks start with mpirun, grpod coordinates";
static const char LP_BSZ[] = "the log-prob passes batch like the update (actor.use_dynamic_bsz, "
                             "actor.ppo_max_token_len_per_gpu)";
static const char NO_CRITIC[] = "GRPO trains no critic";
static const char CKPT[] = "checkpoints always hold the weights, the optimizer state and the data cursor";
static const char PROFILE[] = "profile with perf or nsys around the process";
static const char HF_LOAD[] = "the trainers load the Hugging Face safetensors directly";
static const char RM_HERE[] = "the reward model scores each response beside generation, on the rollout's ranks";
static const char QAT[] = "quantization-aware training (not available yet)";
static const char PAD_BUCKET[] = "packed micro-batches are not padded up to a bucket length here";
static const char CHUNKS[] = "the LM head is always computed in chunks of its own size";
static const char VEOMNI[] = "VeOmni's engine options (FSDP sharding, offload, kernels, attention): the trainer here "
                             "is its own engine, laid out by the megatron.* keys";
static const char TITAN[] = "TorchTitan's engine options (FSDP sharding, compile, attention type): the trainer here is "
                            "its own engine, laid out by the megatron.* keys";
static const char V1_ASYNC[] = "used only by verl v1's asynchronous trainer modes (trainer.v1.trainer_mode)";

static const struct verl_key g_verl[] = {
    /* data */
    NOTED("data.tokenizer", "the tokenizer comes with actor_rollout_ref.model.path"),
    NOTED("data.use_shm", "no shared-memory copy of the model is needed here"),
    NOTED("data.return_raw_input_ids", "verl's dataloader output; prompts are tokenized once here"),
    NOTED("data.return_raw_chat", "verl's dataloader output; the chat messages are always kept here"),
    NOTED("data.return_full_prompt", "verl's dataloader output"),
    NOTED("data.return_multi_modal_inputs", "verl's dataloader output; text only here"),
    NOTED("data.dataloader_num_workers", "prompts are tokenized once at start-up"),
    NOTED("data.filter_overlong_prompts_workers", "prompts are tokenized once at start-up"),
    NOTED("data.validation_shuffle", "validation runs every held-out prompt in file order"),
    NOTED("data.trust_remote_code", "no Python code is loaded"),
    NOTED("data.image_key", "text only: no image column is read"),
    NOTED("data.video_key", "text only: no video column is read"),
    NOTED("data.custom_cls.*", "datasets are JSONL or parquet in verl's layout, or built-in tasks"),
    NOTED("data.sampler.*", "prompts are drawn in the seeded order of data.shuffle and data.seed"),
    NOTED("data.datagen.*", "dynamic datasets are not used"),
    NOTED("data.image_patch_size", "text only: no images"),
    NOTED("data.tool_config_path",
          "the tools in the prompt are those of actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    /* actor_rollout_ref */
    NOTED("actor_rollout_ref.hybrid_engine",
          "rollout and trainer share a process (hybrid) or take ranks (placement.*)"),
    NOTED("actor_rollout_ref.model.use_shm", "no shared-memory copy of the model is needed here"),
    NOTED("actor_rollout_ref.model.external_lib", "no Python module is imported"),
    NOTED("actor_rollout_ref.model.override_config.*", "the model's config.json is used as it is"),
    NOTED("actor_rollout_ref.model.use_remove_padding", PADDING),
    NOTED("actor_rollout_ref.model.use_liger", TORCH),
    NOTED("actor_rollout_ref.model.use_fused_kernels", TORCH),
    NOTED("actor_rollout_ref.model.fused_kernel_options.*", TORCH),
    NOTED("actor_rollout_ref.model.trust_remote_code", "no Python code is loaded"),
    NOTED("actor_rollout_ref.model.hf_config_path", "config.json comes from actor_rollout_ref.model.path"),
    OFF_ONLY("actor_rollout_ref.model.tokenizer_path", "null", "the tokenizer comes with actor_rollout_ref.model.path",
             "a tokenizer other than the model's (not available yet)"),
    NOTED("actor_rollout_ref.model.tiled_mlp.*", TORCH),
    OFF_ONLY("actor_rollout_ref.model.lora.type", "lora", "LoRA is the adapter type",
             "adapter types other than LoRA (not available)"),
    OFF_ONLY("actor_rollout_ref.model.lora.dropout", "0|0.0", "no dropout on the adapter's input",
             "LoRA dropout (not available yet)"),
    NOTED("actor_rollout_ref.model.lora.dropout_position", "used only with LoRA dropout"),
    NOTED("actor_rollout_ref.model.lora.dtype", "the adapter is kept and trained in fp32"),
    NOTED("actor_rollout_ref.model.lora.lora_A_init_method",
          "A starts kaiming-uniform from data.seed, B zero (PEFT's)"),
    NOTED("actor_rollout_ref.model.lora.lora_B_init_method",
          "A starts kaiming-uniform from data.seed, B zero (PEFT's)"),
    NOTED("actor_rollout_ref.model.lora.a2a_experimental", "a Megatron MoE option; no experts here"),
    NOTED("actor_rollout_ref.model.lora.freeze_language_model", "text only: LoRA freezes the base weights"),
    NOTED("actor_rollout_ref.model.lora.freeze_vision_model", "text only: no vision model"),
    NOTED("actor_rollout_ref.model.lora.freeze_vision_projection", "text only: no vision model"),
    NOTED("actor_rollout_ref.actor.freeze_vision_tower", "text only: no vision tower"),
    OFF_ONLY("actor_rollout_ref.actor.load_weight", "true", "the weights come from actor_rollout_ref.model.path",
             "training from random weights (not available)"),
    NOTED("actor_rollout_ref.actor.rollout_n", "set from actor_rollout_ref.rollout.n"),
    NOTED("actor_rollout_ref.actor.data_loader_seed", "every random draw derives from data.seed"),
    NOTED("actor_rollout_ref.actor.calculate_entropy", "actor/entropy is computed every step"),
    NOTED("actor_rollout_ref.actor.use_fused_kernels", TORCH),
    NOTED("actor_rollout_ref.actor.use_remove_padding", PADDING),
    NOTED("actor_rollout_ref.actor.router_replay.*",
          "R2's record and replay files; R3 carries the routes in the batch"),
    NOTED("actor_rollout_ref.ref.router_replay.*", "the reference routes by its own router"),
    NOTED("actor_rollout_ref.actor.profiler.*", PROFILE),
    NOTED("actor_rollout_ref.ref.profiler.*", PROFILE),
    NOTED("actor_rollout_ref.ref.load_weight", "the reference is the initial policy (or the base under LoRA)"),
    NOTED("actor_rollout_ref.ref.rollout_n", "set from actor_rollout_ref.rollout.n"),
    /* optimizer: verl's FSDP and Megatron optimizer blocks */
    OFF_ONLY("actor_rollout_ref.actor.optim.optimizer", "adamw|adam", "the optimizer is AdamW",
             "optimizers other than AdamW (not available)"),
    NOTED("actor_rollout_ref.actor.optim.optimizer_impl", "AdamW is implemented here, in C"),
    NOTED("actor_rollout_ref.actor.optim.weight_decay_incr_style",
          "verl gives Megatron the same starting and final weight decay, so every style keeps it constant"),
    NOTED("actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler", CKPT),
    NOTED("actor_rollout_ref.actor.optim.override_optimizer_config.*",
          "Megatron optimizer options (offload, precision); AdamW here keeps fp32 state in host or device memory"),
    /* Megatron's trainer block beyond the parallel sizes */
    NOTED("actor_rollout_ref.actor.megatron.dtype", "the trainer's precision is actor_rollout_ref.actor.dtype"),
    OFF_ONLY("actor_rollout_ref.actor.megatron.expert_tensor_parallel_size", "1|null",
             "each expert splits over the training TP (null, Megatron's default); 1 does the same sums",
             "tensor parallelism inside each expert other than the training TP's (not available yet)"),
    NOTED("actor_rollout_ref.actor.megatron.forward_only", "verl's internal flag"),
    NOTED("actor_rollout_ref.actor.megatron.use_mbridge", HF_LOAD),
    NOTED("actor_rollout_ref.actor.megatron.vanilla_mbridge", HF_LOAD),
    NOTED("actor_rollout_ref.actor.megatron.use_remove_padding", PADDING),
    OFF_ONLY("actor_rollout_ref.actor.megatron.use_dist_checkpointing", "false", HF_LOAD,
             "loading Megatron distributed checkpoints (not available: give the Hugging Face model)"),
    NOTED("actor_rollout_ref.actor.megatron.dist_checkpointing_path", "used only with use_dist_checkpointing"),
    NOTED("actor_rollout_ref.actor.megatron.dist_checkpointing_prefix", "used only with use_dist_checkpointing"),
    NOTED("actor_rollout_ref.actor.megatron.override_ddp_config.*",
          "Megatron DDP options; overlap_grad_reduce and bucket_size are the ones that apply here"),
    NOTED("actor_rollout_ref.actor.megatron.override_mcore_model_config.*", "the model's config.json is used as it is"),
    NOTED("actor_rollout_ref.actor.megatron.override_transformer_config.*",
          "Megatron's TransformerConfig; recomputation is actor_rollout_ref.model.enable_gradient_checkpointing here"),
    NOTED("actor_rollout_ref.actor.strategy", "the trainers' layout is the megatron.* keys here"),
    NOTED("actor_rollout_ref.actor.use_torch_compile", TORCH),
    NOTED("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "the LM head is always computed in chunks"),
    NOTED("actor_rollout_ref.actor.entropy_checkpointing", "the LM head's chunks are always recomputed"),
    OFF_ONLY("actor_rollout_ref.actor.shuffle", "false", "mini-batches follow the step's order, as verl's default",
             "shuffled mini-batches (not available yet)"),
    NOTED("actor_rollout_ref.actor.checkpoint.*", CKPT),
    NOTED("actor_rollout_ref.actor.optim.total_training_steps", "set from trainer.total_training_steps"),
    NOTED("actor_rollout_ref.actor.optim.num_cycles", "the cosine schedule decays once, as verl's default 0.5"),
    /* verl v0.9's quantization-aware training, in each engine block (before fsdp_config.* below) */
    OFF_ONLY("actor_rollout_ref.actor.qat.enable", "false", "no quantization-aware training", QAT),
    NOTED("actor_rollout_ref.actor.qat.*", "used only with quantization-aware training (qat.enable)"),
    OFF_ONLY("actor_rollout_ref.actor.fsdp_config.qat.enable", "false", "no quantization-aware training", QAT),
    NOTED("actor_rollout_ref.actor.fsdp_config.qat.*", "used only with quantization-aware training (qat.enable)"),
    OFF_ONLY("actor_rollout_ref.actor.megatron.qat.enable", "false", "no quantization-aware training", QAT),
    NOTED("actor_rollout_ref.actor.megatron.qat.*", "used only with quantization-aware training (qat.enable)"),
    NOTED("actor_rollout_ref.actor.fsdp_config.*", FSDP),
    NOTED("actor_rollout_ref.actor.megatron.param_offload", "parameters live in host memory on the CPU path"),
    NOTED("actor_rollout_ref.actor.megatron.grad_offload", "gradients live in host memory on the CPU path"),
    NOTED("actor_rollout_ref.actor.megatron.optimizer_offload", "the optimizer lives in host memory on the CPU path"),
    OFF_ONLY("actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size", "null|1",
             "no interleaving: the non-interleaved 1F1B schedule", "interleaved pipeline stages (not available yet)"),
    NOTED("actor_rollout_ref.actor.megatron.sequence_parallel", "TP all-reduces the hidden states (no sequence split)"),
    NOTED("actor_rollout_ref.actor.megatron.seed", "every random draw derives from data.seed"),
    NOTED("actor_rollout_ref.ref.strategy", "the reference runs in the trainer's layout"),
    NOTED("actor_rollout_ref.ref.fsdp_config.*", FSDP),
    NOTED("actor_rollout_ref.ref.megatron.*", "the reference runs in the trainer's layout"),
    NOTED("actor_rollout_ref.ref.use_torch_compile", TORCH),
    NOTED("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", LP_BSZ),
    NOTED("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", LP_BSZ),
    NOTED("actor_rollout_ref.ref.ulysses_sequence_parallel_size",
          "the reference's log-probs run in the actor's sequence-parallel group "
          "(actor_rollout_ref.actor.ulysses_sequence_parallel_size)"),
    NOTED("actor_rollout_ref.ref.entropy_from_logits_with_chunking", "the LM head is always computed in chunks"),
    NOTED("actor_rollout_ref.ref.entropy_checkpointing", "the LM head's chunks are always recomputed"),
    NOTED("actor_rollout_ref.rollout.name", "generation runs in this engine (no vLLM or SGLang)"),
    NOTED("actor_rollout_ref.rollout.load_format", "weights come from the trainers in buckets"),
    NOTED("actor_rollout_ref.rollout.layered_summon", "weights come from the trainers in buckets"),
    NOTED("actor_rollout_ref.rollout.max_num_batched_tokens", ENGINE),
    NOTED("actor_rollout_ref.rollout.max_model_len", "data.max_prompt_length + data.max_response_length bound it"),
    NOTED("actor_rollout_ref.rollout.disable_log_stats", ENGINE),
    NOTED("actor_rollout_ref.rollout.enable_chunked_prefill", ENGINE),
    NOTED("actor_rollout_ref.rollout.engine_kwargs.*", ENGINE),
    NOTED("actor_rollout_ref.rollout.skip_tokenizer_init", ENGINE),
    NOTED("actor_rollout_ref.rollout.calculate_log_probs", "the sampler's log-probs are always kept"),
    NOTED("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", LP_BSZ),
    NOTED("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", LP_BSZ),
    OFF_ONLY("actor_rollout_ref.rollout.do_sample", "true", "rollouts sample",
             "greedy rollouts: set actor_rollout_ref.rollout.temperature=0 instead"),
    OFF_ONLY("actor_rollout_ref.rollout.agent.agent_loop_config_path", "null", "no agent loop is configured",
             "agent loops (not available yet)"),
    OFF_ONLY("actor_rollout_ref.rollout.agent.custom_async_server.path", "null", "generation runs in this engine",
             "a custom async rollout server (not available)"),
    NOTED("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template",
          "the model's chat template renders every turn as it was generated"),
    NOTED("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", "rollout.n responses per prompt"),
    NOTED("actor_rollout_ref.rollout.agent.custom_async_server.name", "generation runs in this engine"),
    NOTED("actor_rollout_ref.rollout.cudagraph_capture_sizes", ENGINE),
    NOTED("actor_rollout_ref.rollout.enable_prefix_caching", ENGINE),
    NOTED("actor_rollout_ref.rollout.multi_stage_wake_up", ENGINE),
    NOTED("actor_rollout_ref.rollout.logprobs_mode", ENGINE),
    OFF_ONLY("actor_rollout_ref.rollout.pipeline_model_parallel_size", "1", "1 is no pipeline in generation",
             "pipeline-parallel generation (not available yet)"),
    NOTED("actor_rollout_ref.rollout.layer_name_map.*", "weights are resharded into the engine by name here"),
    OFF_ONLY("actor_rollout_ref.rollout.over_sample_rate", "0|0.0", "every sampled response is kept",
             "over-sampled rollouts cut short (not available yet)"),
    NOTED("actor_rollout_ref.rollout.prometheus.*", "metrics are served by grpod's HTTP endpoint"),
    OFF_ONLY("actor_rollout_ref.rollout.quantization", "null", "weights are not quantized",
             "quantized rollouts (not available yet)"),
    NOTED("actor_rollout_ref.rollout.quantization_config_file", "used only with rollout.quantization"),
    OFF_ONLY("actor_rollout_ref.rollout.skip_rollout", "false", "every step generates",
             "replaying dumped rollouts (not available yet)"),
    NOTED("actor_rollout_ref.rollout.skip_dump_dir", "used only with rollout.skip_rollout"),
    NOTED("actor_rollout_ref.rollout.profiler.*", PROFILE),
    NOTED("actor_rollout_ref.rollout.trace.*", "no tracing back-end"),
    /* critic, reward model */
    NOTED("critic.*", NO_CRITIC),
    NOTED("reward_model.strategy", RM_HERE),
    NOTED("reward_model.model.input_tokenizer", "the prompt text is re-encoded with the reward model's tokenizer"),
    NOTED("reward_model.model.external_lib", "no Python module is imported"),
    NOTED("reward_model.model.trust_remote_code", "no Python code is loaded"),
    NOTED("reward_model.model.use_remove_padding", PADDING),
    NOTED("reward_model.model.fsdp_config.*", FSDP),
    NOTED("reward_model.micro_batch_size", RM_HERE),
    NOTED("reward_model.micro_batch_size_per_gpu", RM_HERE),
    NOTED("reward_model.use_dynamic_bsz", RM_HERE),
    NOTED("reward_model.forward_max_token_len_per_gpu", RM_HERE),
    NOTED("reward_model.ulysses_sequence_parallel_size", RM_HERE),
    NOTED("reward_model.launch_reward_fn_async", "scoring runs beside generation on the rollout ranks"),
    OFF_ONLY("reward_model.reward_manager", "naive|dapo|batch",
             "rule scores are per sample here (the DAPO overlong penalty is reward_model.overlong_buffer.*)",
             "reward managers other than naive, dapo and batch (not available)"),
    NOTED("reward_model.sandbox_fusion.*", "no code sandbox: scorers are built in or custom_reward_function.path"),
    NOTED("custom_reward_function.reward_kwargs.*", "a custom scorer takes no keyword arguments here"),
    NOTED("reward_model.enable_resource_pool", RM_HERE),
    NOTED("reward_model.nnodes", RM_HERE),
    NOTED("reward_model.n_gpus_per_node", RM_HERE),
    NOTED("reward_model.nccl_timeout", RM_HERE),
    NOTED("reward_model.load_weight", "the reward model loads from reward_model.model.path"),
    NOTED("reward_model.model.override_config.*", "the reward model's config.json is used as it is"),
    NOTED("reward_model.model.use_fused_kernels", TORCH),
    NOTED("reward_model.model.use_shm", "no shared-memory copy of the model is needed here"),
    NOTED("reward_model.megatron.*", RM_HERE),
    NOTED("reward_model.profiler.*", PROFILE),
    NOTED("reward_model.use_reward_loop", "scoring already runs beside generation, as verl's reward loop does"),
    NOTED("reward_model.reward_loop_source", "the reward loop is built in"),
    NOTED("reward_model.reward_loop_module_path", "the reward loop is built in"),
    NOTED("reward_model.reward_loop_class_name", "the reward loop is built in"),
    NOTED("reward_model.rollout.*", "a generative reward model's engine (not available): the reward model here is a "
                                    "sequence classifier"),
    NOTED("reward_model.overlong_buffer.log", "the overlong penalty is part of each logged score"),
    NOTED("reward_model.reward_kwargs.*", "a keyword argument of verl's reward manager; the ones read here are "
                                          "overlong_buffer_cfg.* and max_resp_len"),
    OFF_ONLY("reward_manager.name", "naive|dapo|batch", "rule scores are per sample here",
             "reward managers other than naive, dapo and batch (not available)"),
    OFF_ONLY("reward_manager.source", "register", "the reward managers are built in",
             "a reward manager imported from a module (not available)"),
    NOTED("reward_manager.module.*", "used only with reward_manager.source=importlib"),
    /* algorithm */
    NOTED("algorithm.lam", "GRPO's outcome advantages use no GAE"),
    OFF_ONLY("algorithm.kl_ctrl.type", "fixed", "the KL coefficient is fixed (algorithm.kl_ctrl.kl_coef)",
             "an adaptive KL controller (not available yet)"),
    NOTED("algorithm.kl_ctrl.horizon", "used only by the adaptive KL controller"),
    NOTED("algorithm.kl_ctrl.target_kl", "used only by the adaptive KL controller"),
    OFF_ONLY("algorithm.use_pf_ppo", "false", "preference feedback PPO is off", "PF-PPO resampling (not available)"),
    NOTED("algorithm.pf_ppo.*", "PF-PPO is off"),
    /* verl v0.7's rollout-correction keys that v0.9 dropped: their "off" value is accepted */
    OFF_ONLY("algorithm.rollout_correction.rollout_rs_threshold_lower", "null", "verl v0.9 has no separate lower bound",
             "verl v0.7's separate lower rejection bound (not available: verl v0.9 dropped it; give "
             "rollout_rs_threshold as 'lower_upper')"),
    OFF_ONLY("algorithm.rollout_correction.rollout_token_veto_threshold", "null", "verl v0.9 has no token veto",
             "verl v0.7's catastrophic-token veto (not available: verl v0.9 dropped it; a token_k1 rejection bound "
             "does its work)"),
    /* trainer */
    OFF_ONLY("trainer.critic_warmup", "0", NO_CRITIC, "critic warm-up steps (GRPO trains no critic)"),
    OFF_ONLY("trainer.balance_batch", "true|false", "sequences are always balanced by tokens over the DP ranks",
             "a value other than true or false"),
    NOTED("trainer.profile_steps", "profile with perf or nsys around the process"),
    NOTED("trainer.esi_redundant_time", "checkpoint timing follows save_freq and stop requests"),
    NOTED("trainer.ray_wait_register_center_timeout", RAY),
    NOTED("trainer.default_hdfs_dir", "checkpoints go to trainer.default_local_dir"),
    NOTED("trainer.del_local_ckpt_after_load", "checkpoints are kept as trainer.max_actor_ckpt_to_keep says"),
    NOTED("trainer.max_critic_ckpt_to_keep", NO_CRITIC),
    NOTED("trainer.use_legacy_worker_impl", RAY),
    NOTED("trainer.log_val_generations", "validation generations go to the rollout audit files"),
    NOTED("ray_init.*", RAY),
    NOTED("ray_kwargs.*", RAY),
    NOTED("transfer_queue.*", "data moves over this project's data plane"),
    NOTED("global_profiler.*", PROFILE),
    /* verl v0.9: the actor and the reference */
    NOTED("actor_rollout_ref.actor.entropy_from_logits_chunk_size", CHUNKS),
    NOTED("actor_rollout_ref.actor.pad_to_length", PAD_BUCKET),
    NOTED("actor_rollout_ref.actor.megatron.dist_ckpt_optim_fully_reshardable", CKPT),
    NOTED("actor_rollout_ref.actor.megatron.distrib_optim_fully_reshardable_mem_efficient", CKPT),
    OFF_ONLY("actor_rollout_ref.actor.megatron.dynamic_context_parallel", "false",
             "context parallelism is the fixed context_parallel_size",
             "dynamic context parallelism (not available yet)"),
    NOTED("actor_rollout_ref.actor.megatron.max_seqlen_per_dp_cp_rank", "used only with dynamic_context_parallel"),
    NOTED("actor_rollout_ref.actor.megatron.entropy_from_logits_with_chunking",
          "the LM head is always computed in chunks"),
    NOTED("actor_rollout_ref.actor.megatron.entropy_from_logits_chunk_size", CHUNKS),
    NOTED("actor_rollout_ref.actor.megatron.pad_bshd_to_minibatch_max", PADDING),
    NOTED("actor_rollout_ref.actor.megatron.pad_to_length", PAD_BUCKET),
    NOTED("actor_rollout_ref.actor.megatron.pad_to_length_bucket", PAD_BUCKET),
    NOTED("actor_rollout_ref.actor.megatron.use_megatron_fsdp",
          "Megatron-FSDP's ZeRO-3 sharding: the trainers here shard the optimizer state at most (ZeRO-1, "
          "megatron.use_distributed_optimizer)"),
    NOTED("actor_rollout_ref.actor.megatron.router_replay.*",
          "R2's record and replay files; R3 carries the routes in the batch"),
    NOTED("actor_rollout_ref.actor.veomni.router_replay.*",
          "R2's record and replay files; R3 carries the routes in the batch"),
    NOTED("actor_rollout_ref.actor.veomni.*", VEOMNI),
    NOTED("actor_rollout_ref.actor.torchtitan.*", TITAN),
    NOTED("actor_rollout_ref.ref.veomni.*", "the reference runs in the trainer's layout"),
    NOTED("actor_rollout_ref.ref.torchtitan.*", "the reference runs in the trainer's layout"),
    NOTED("actor_rollout_ref.ref.optim.*", "the reference is never trained (verl's engine block carries an optimizer)"),
    NOTED("actor_rollout_ref.ref.entropy_from_logits_chunk_size", CHUNKS),
    NOTED("actor_rollout_ref.ref.pad_to_length", PAD_BUCKET),
    NOTED("model_engine", "verl's choice of training-engine configs (dp, megatron, veomni, torchtitan...): the trainer "
                          "here is its own engine, laid out by the megatron.* keys"),
    NOTED("hydra.*", "Hydra's own settings (config search path, output directory): there is no Hydra here"),
    OFF_ONLY("actor@actor_rollout_ref.actor", "dp_actor|megatron_actor|veomni_actor|torchtitan_actor|mindspeed_actor",
             "verl's choice of actor engine config: the trainer here is its own engine, laid out by the megatron.* "
             "keys",
             "an actor config group outside verl's own (mlite_actor is Megatron-Lite's, an external plugin; not "
             "available)"),
    /* verl v0.9's optimizer blocks of the Megatron, VeOmni and TorchTitan engines */
    OFF_ONLY("actor_rollout_ref.actor.optim.name", "adamw|adam", "the optimizer is AdamW",
             "optimizers other than AdamW (not available)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.decay_type", "null",
             "the schedule after warm-up is actor_rollout_ref.actor.optim.lr_scheduler_type's",
             "TorchTitan's learning-rate decay (not available: give actor_rollout_ref.actor.optim.lr_scheduler_type "
             "constant or cosine)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.lr_min", "0|0.0", "the floor is min_lr_ratio x lr",
             "an absolute minimum learning rate (not available: give actor_rollout_ref.actor.optim.min_lr_ratio)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.lr_start", "0|0.0", "warm-up starts from 0",
             "a warm-up starting learning rate (not available yet)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.lr_decay_ratio", "1|1.0", "the schedule spans the run's steps",
             "a decay over part of the run (not available yet)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.zero_indexed_step", "true",
             "the schedule counts the first update as step 0, as verl's default",
             "a schedule counting the first update as step 1 (not available yet)"),
    OFF_ONLY("actor_rollout_ref.actor.optim.use_precision_aware_optimizer", "false",
             "AdamW keeps fp32 gradients and moments",
             "Megatron's precision-aware optimizer with bf16 moments (not available yet)"),
    NOTED("actor_rollout_ref.actor.optim.main_grads_dtype", "used only with use_precision_aware_optimizer"),
    NOTED("actor_rollout_ref.actor.optim.exp_avg_dtype", "used only with use_precision_aware_optimizer"),
    NOTED("actor_rollout_ref.actor.optim.exp_avg_sq_dtype", "used only with use_precision_aware_optimizer"),
    NOTED("actor_rollout_ref.actor.optim.use_layer_wise_distributed_optimizer",
          "used only by Muon (optim.optimizer=muon, not available)"),
    NOTED("actor_rollout_ref.actor.optim.muon_*", "used only by Muon (optim.optimizer=muon, not available)"),
    /* verl v0.9: the model */
    NOTED("actor_rollout_ref.model.lora.merge",
          "how the adapter reaches vLLM; generation here runs with the trained adapter either way"),
    OFF_ONLY("actor_rollout_ref.model.mtp.enable", "false", "no multi-token prediction layers",
             "multi-token prediction (MTP) layers (not available yet)"),
    NOTED("actor_rollout_ref.model.mtp.*", "used only with multi-token prediction (model.mtp.enable)"),
    /* verl v0.9: the rollout */
    NOTED("actor_rollout_ref.rollout.seed", "sampling draws from seeds derived from data.seed and the step"),
    NOTED("actor_rollout_ref.rollout.full_determinism",
          "a PyTorch and vLLM determinism switch; sampling here draws from seeds derived from data.seed and the step"),
    NOTED("actor_rollout_ref.rollout.scheduling_policy", ENGINE),
    NOTED("actor_rollout_ref.rollout.enable_sleep_mode", ENGINE),
    NOTED("actor_rollout_ref.rollout.standalone_gpu_memory_utilization",
          "fully-async's standalone replicas' memory; the rollout ranks' KV cache follows "
          "actor_rollout_ref.rollout.gpu_memory_utilization"),
    OFF_ONLY("actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "0", "no rollout load-balance metrics",
             "mixture-of-experts load-balance metrics of the rollout's routes (not available yet)"),
    OFF_ONLY("actor_rollout_ref.rollout.moe_tensor_parallel_size", "1", "1 is no tensor parallelism inside experts",
             "TensorRT-LLM's tensor parallelism inside the experts in generation (not available)"),
    OFF_ONLY("actor_rollout_ref.rollout.mtp", "null", "no speculative decoding",
             "multi-token prediction (MTP) speculative decoding in generation (not available yet)"),
    OFF_ONLY("actor_rollout_ref.rollout.qat", "null", "no quantization-aware training", QAT),
    NOTED("actor_rollout_ref.rollout.checkpoint_engine.backend",
          "weights reach the rollout ranks as actor_rollout_ref.rollout.weight_sync says"),
    OFF_ONLY("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", "null",
             "weights reach the rollout ranks as actor_rollout_ref.rollout.weight_sync says",
             "a custom checkpoint-engine back-end (not available)"),
    NOTED("actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.*",
          "weights reach the rollout ranks as actor_rollout_ref.rollout.weight_sync says"),
    OFF_ONLY("actor_rollout_ref.rollout.disaggregation.enabled", "false", "prefill and decode run together",
             "prefill-decode disaggregated generation (not available)"),
    NOTED("actor_rollout_ref.rollout.disaggregation.*", "used only with disaggregation.enabled"),
    REFUSED("actor_rollout_ref.rollout.single_turn_response_length",
            "a per-turn response budget in multi-turn rollouts (not available; no verl v0.9 config or code has this "
            "key either)"),
    /* verl v0.9: data */
    NOTED("data.audio_key", "text only: no audio column is read"),
    NOTED("data.mm_processor_kwargs.*", "text only: no multi-modal processor"),
    NOTED("data.function_tool_path",
          "the tools in the prompt are those of actor_rollout_ref.rollout.multi_turn.function_tool_path"),
    NOTED("data.continuous_token.*",
          "multi-turn trajectories here keep each model turn's tokens as generated (docs/agents.md)"),
    NOTED("data.min_response_length", "no verl v0.9 code reads it (a key scripts add with +)"),
    /* verl v0.9: the reward block (reward.*) beside the legacy reward_model.* */
    OFF_ONLY("reward.reward_manager.name", "naive|dapo|batch", "rule scores are per sample here",
             "reward managers other than naive, dapo and batch (not available)"),
    OFF_ONLY("reward.reward_manager.source", "register", "the reward managers are built in",
             "a reward manager imported from a module (not available)"),
    NOTED("reward.reward_manager.module.*", "used only with reward.reward_manager.source=importlib"),
    NOTED("reward.reward_kwargs.*", "a keyword argument of verl's reward manager; the ones read here are "
                                    "overlong_buffer_cfg.* and max_resp_len"),
    NOTED("reward.reward_model.enable_resource_pool", RM_HERE),
    NOTED("reward.reward_model.nnodes", RM_HERE),
    NOTED("reward.reward_model.n_gpus_per_node", RM_HERE),
    NOTED("reward.reward_model.rollout.*", "a generative reward model's engine (not available): the reward model here "
                                           "is a sequence classifier"),
    NOTED("reward.sandbox_fusion.*", "no code sandbox: scorers are built in or custom_reward_function.path"),
    NOTED("sandbox_fusion.*", "no code sandbox: scorers are built in or custom_reward_function.path"),
    /* verl v0.9: the algorithm */
    OFF_ONLY("algorithm.filter_groups.max_inflight_gen_batches", "1", "one generation round is in flight at a time",
             "overlapped DAPO generation rounds (not available yet)"),
    /* verl v0.9: the v1 trainer, fully-async training, rollout replay, distillation */
    NOTED("trainer.use_v1", "which of verl's trainer implementations runs (v0 or v1)"),
    OFF_ONLY("trainer.v1.trainer_mode", "sync", "the synchronous trainer",
             "verl v1's asynchronous trainer modes, colocate_async and separate_async (not available yet; "
             "separate_async's staleness-bounded training is the planned fully-async training)"),
    NOTED("trainer.v1.sync.*", "the synchronous trainer's options"),
    NOTED("trainer.v1.colocate_async.*", V1_ASYNC),
    NOTED("trainer.v1.separate_async.*", V1_ASYNC),
    OFF_ONLY("trainer.v1.sampler.sync_refill_failed_groups", "false", "no group is refilled",
             "refilling groups whose trajectories all failed (not available yet)"),
    OFF_ONLY("trainer.v1.sampler.custom_sampler.path", "null", "the step's groups are trained as generated",
             "a custom replay-buffer sampler (not available)"),
    NOTED("trainer.v1.sampler.custom_sampler.name", "used only with trainer.v1.sampler.custom_sampler.path"),
    NOTED("trainer.v1.sampler.sampler_kwargs.*", "used only with trainer.v1.sampler.custom_sampler.path"),
    NOTED("trainer.v1.sampler.max_off_policy_threshold", V1_ASYNC),
    NOTED("trainer.v1.sampler.max_off_policy_strategy", V1_ASYNC),
    /* verl's fully-async trainer: staleness_threshold, trigger_parameter_sync_step, require_batches and
     * partial_rollout are ours (config_keys.def) */
    NOTED("async_training.use_trainer_do_validate", "validation runs on trainer DP rank 0 here in every layout"),
    NOTED("async_training.concurrent_samples_per_replica",
          "a rollout rank generates one work unit at a time, its sequences decoded together up to "
          "actor_rollout_ref.rollout.max_num_seqs"),
    OFF_ONLY("async_training.use_dynamic_resource_scheduling", "false", "the trainer ranks only train",
             "dynamic resource scheduling: trainer ranks that also generate in fully-async training (not available "
             "yet)"),
    NOTED("async_training.dynamic_schedule_*", "used only with async_training.use_dynamic_resource_scheduling"),
    REFUSED("rollout.n", "responses per prompt are actor_rollout_ref.rollout.n (verl's fully-async config declares "
                         "rollout.n, but no verl v0.9 code reads it)"),
    OFF_ONLY("skip.rollout.enable", "false", "every step generates", "replaying dumped rollouts (not available yet)"),
    OFF_ONLY("skip.rollout_tq.enable", "false", "every step generates",
             "replaying dumped rollouts (not available yet)"),
    OFF_ONLY("skip.async_rollout.enable", "false", "every step generates",
             "replaying dumped rollouts (not available yet)"),
    NOTED("skip.*", "used only with replayed rollouts (skip.*.enable)"),
    OFF_ONLY("distillation.enabled", "false", "no teacher model",
             "on-policy distillation from a teacher model (not available yet)"),
    NOTED("distillation.*", "used only with distillation.enabled"),
};

/* Values of our keys that verl knows and that do not run here, each with why (an enum's value outside its choices,
 * or any other key's value as written). */
static const struct {
    const char *key, *value, *why;
} g_refused_values[] = {
    {"algorithm.adv_estimator", "gae", "GAE needs a critic's values (training here has no critic)"},
    {"trainer.device", "npu", "Ascend NPUs (not available: cuda or cpu)"},
    {"actor_rollout_ref.actor.policy_loss.loss_mode", "bypass_mode",
     "verl's trainer sets that loss itself in bypass mode: set algorithm.rollout_correction.bypass_mode=true (and "
     "its loss_type)"},
};

const char *config_verl_value_refused(const char *name, const char *value)
{
    for (size_t i = 0; value && i < sizeof g_refused_values / sizeof *g_refused_values; i++)
        if (strcmp(g_refused_values[i].key, name) == 0 && strcmp(g_refused_values[i].value, value) == 0)
            return g_refused_values[i].why;
    return NULL;
}

/* Whether value (as config_set gets it: the command line's quotes are gone, config_apply_override strips them)
 * is one of list's '|'-separated values, any case; null counts as the default, the "off" value. */
static bool value_in(const char *list, const char *value)
{
    const char *v = value ? value : "";
    if (!v[0] || strcmp(v, "null") == 0 || strcmp(v, "~") == 0 || strcasecmp(v, "none") == 0)
        return true; /* null: the default, which is the "off" value */
    const size_t n = strlen(v);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        const size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && strncasecmp(p, v, n) == 0)
            return true;
        p += k + (bar ? 1 : 0);
    }
    return false;
}

static bool matches(const char *pattern, const char *name)
{
    const size_t n = strlen(pattern);
    if (n >= 2 && strcmp(pattern + n - 2, ".*") == 0) /* the prefix with its dot, or the section itself (=null) */
        return strncmp(name, pattern, n - 1) == 0 || (strncmp(name, pattern, n - 2) == 0 && !name[n - 2]);
    if (n >= 1 && pattern[n - 1] == '*') /* a name prefix (optim.muon_*) */
        return strncmp(name, pattern, n - 1) == 0;
    return strcmp(pattern, name) == 0;
}

/* verl's names for keys of ours: current verl spellings (model.lora.*, optim.clip_grad, the scheduler's name) and
 * the overlong buffer's place under reward_kwargs. Each means exactly our key. */
static const struct {
    const char *verl, *ours;
} g_alias[] = {
    {"actor_rollout_ref.model.lora.rank", "actor_rollout_ref.model.lora_rank"},
    {"actor_rollout_ref.model.lora.alpha", "actor_rollout_ref.model.lora_alpha"},
    {"actor_rollout_ref.model.lora.target_modules", "actor_rollout_ref.model.target_modules"},
    {"actor_rollout_ref.model.lora.exclude_modules", "actor_rollout_ref.model.exclude_modules"},
    {"actor_rollout_ref.model.lora.adapter_path", "actor_rollout_ref.model.lora_adapter_path"},
    {"actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"},
    {"actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.warmup_style"},
    {"actor_rollout_ref.actor.optim.lr_decay_style", "actor_rollout_ref.actor.optim.warmup_style"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.enable", "reward_model.overlong_buffer.enable"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward_model.overlong_buffer.len"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward_model.overlong_buffer.penalty_factor"},
    {"reward_model.reward_kwargs.overlong_buffer_cfg.log", "reward_model.overlong_buffer.log"},
    /* verl v0.9's names */
    {"reward.num_workers", "reward_model.num_workers"},
    {"reward.custom_reward_function.path", "custom_reward_function.path"},
    {"reward.custom_reward_function.name", "custom_reward_function.name"},
    {"reward.reward_kwargs.max_resp_len", "reward_model.reward_kwargs.max_resp_len"},
    {"reward.reward_kwargs.overlong_buffer_cfg.enable", "reward_model.overlong_buffer.enable"},
    {"reward.reward_kwargs.overlong_buffer_cfg.len", "reward_model.overlong_buffer.len"},
    {"reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward_model.overlong_buffer.penalty_factor"},
    {"reward.reward_kwargs.overlong_buffer_cfg.log", "reward_model.overlong_buffer.log"},
    {"reward.reward_model.enable", "reward_model.enable"},
    {"reward.reward_model.model_path", "reward_model.model.path"},
    {"actor_rollout_ref.rollout.nnodes", "rollout.nnodes"},
    {"actor_rollout_ref.rollout.n_gpus_per_node", "rollout.n_gpus_per_node"},
    {"actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
     "actor_rollout_ref.rollout.update_weights_bucket_megabytes"},
    {"actor_rollout_ref.actor.use_prefix_grouper", "actor_rollout_ref.actor.shared_prompt_packing"},
    {"actor_rollout_ref.actor.optim.min_lr_factor", "actor_rollout_ref.actor.optim.min_lr_ratio"},
    {"actor_rollout_ref.actor.megatron.router_replay.mode", "actor_rollout_ref.actor.router_replay.mode"},
    {"actor_rollout_ref.actor.veomni.router_replay.mode", "actor_rollout_ref.actor.router_replay.mode"},
    {"actor_rollout_ref.actor.veomni.ulysses_parallel_size", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"},
    {"actor_rollout_ref.actor.veomni.expert_parallel_size",
     "actor_rollout_ref.actor.megatron.expert_model_parallel_size"},
    {"actor_rollout_ref.actor.torchtitan.tensor_parallel_size",
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size"},
    {"actor_rollout_ref.actor.torchtitan.pipeline_parallel_size",
     "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"},
    {"actor_rollout_ref.actor.torchtitan.context_parallel_size",
     "actor_rollout_ref.actor.megatron.context_parallel_size"},
    {"actor_rollout_ref.actor.torchtitan.expert_parallel_size",
     "actor_rollout_ref.actor.megatron.expert_model_parallel_size"},
};

const char *config_verl_alias(const char *name)
{
    for (size_t i = 0; i < sizeof g_alias / sizeof *g_alias; i++)
        if (strcmp(g_alias[i].verl, name) == 0)
            return g_alias[i].ours;
    return NULL;
}

int config_verl_alias_count(void) { return (int)(sizeof g_alias / sizeof *g_alias); }

void config_verl_alias_entry(int i, const char **verl, const char **ours)
{
    *verl = g_alias[i].verl;
    *ours = g_alias[i].ours;
}

enum verl_class config_verl_class(const char *name, const char *value, const char **why)
{
    const char *alias = config_verl_alias(name);
    if (alias) /* an alias of a verl key we note (overlong_buffer_cfg.log) */
        name = alias;
    const char *last = strrchr(name, '.');
    if (last && strcmp(last + 1, "_target_") == 0) {
        *why = "the Python class verl builds the block into";
        return VERL_NOTED;
    }
    for (size_t i = 0; i < sizeof g_verl / sizeof *g_verl; i++) {
        const struct verl_key *k = &g_verl[i];
        if (!matches(k->pattern, name))
            continue;
        const bool ok = k->noted && (!k->ok || value_in(k->ok, value));
        *why = ok ? k->noted : k->refused;
        return ok ? VERL_NOTED : VERL_REFUSED;
    }
    *why = NULL;
    return VERL_UNKNOWN;
}

int config_verl_count(void) { return (int)(sizeof g_verl / sizeof *g_verl); }

void config_verl_entry(int i, const char **pattern, const char **ok, const char **noted, const char **refused)
{
    const struct verl_key *k = &g_verl[i];
    *pattern = k->pattern;
    *ok = k->ok;
    *noted = k->noted;
    *refused = k->refused;
}

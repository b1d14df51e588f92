"""The sglang modules the mutants patch, spelled as sglang spells them."""

# Modules of the MTP path, by release: 0.5.13 runs Frozen-KV MTP on the non-overlap worker (frozen_kv_mtp_worker,
# EAGLE v1 verify in eagle_info); 0.5.17 and later on the spec-v2 worker (frozen_kv_mtp_worker_v2, eagle_utils).
FROZEN_KV_MTP_WORKER = "sglang.srt.speculative.frozen_kv_mtp_worker"
FROZEN_KV_MTP_WORKER_V2 = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
FROZEN_KV_MTP_UTILS = "sglang.srt.speculative.frozen_kv_mtp_utils"
SPEC_UTILS = "sglang.srt.speculative.spec_utils"
EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
EAGLE_INFO = "sglang.srt.speculative.eagle_info"
EAGLE_INFO_V2 = "sglang.srt.speculative.eagle_info_v2"
GEMMA4_MTP = "sglang.srt.models.gemma4_mtp"
BATCH_RESULT_PROCESSOR = "sglang.srt.managers.scheduler_components.batch_result_processor"
METRICS_REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter"
SCHEDULE_BATCH = "sglang.srt.managers.schedule_batch"
SCHEDULER = "sglang.srt.managers.scheduler"
LAYERS_UTILS_LOGPROB = (
    "sglang.srt.layers.utils.logprob"  # 0.5.13: add_output_logprobs_for_spec_v1 (the v1 worker's logprobs)
)
LOGPROB_PROCESSOR = (
    "sglang.srt.layers.logprob_processor"  # 0.5.17 compute_spec_v2_logprobs, 0.5.23 compute_spec_logprobs
)
# the long-and-tight family's paths and the request shapes' (issue #38)
TRITON_BACKEND = "sglang.srt.layers.attention.triton_backend"  # the smoke servers' --attention-backend
MEM_CACHE_COMMON = "sglang.srt.mem_cache.common"  # release_kv_cache and its over-allocated tail
TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager"
OUTPUT_STREAMER = "sglang.srt.managers.scheduler_components.output_streamer"

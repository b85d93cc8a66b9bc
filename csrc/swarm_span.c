// swarm_span.c: see swarm_span.h. Built by scripts/build_csrc.sh against llama-cpp-python's
// headers and libraries, so this library and llama_cpp share one llama.cpp/ggml in the process.

#include "swarm_span.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

#define CAPTURE_NAME_MAX 64

// llama.cpp's staging API (src/llama-ext.h) has C++ linkage and is not in the installed headers:
// this binds a C declaration to its mangled symbol (Itanium ABI: bool passes as in C). It makes the
// context compute the output-normed residual `h_nextn` of every row of a batch ("unmasked"), as
// common/speculative.cpp asks of a target context that feeds an MTP head.
void swarm_llama_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked)
    __asm__("_Z26llama_set_embeddings_nextnP13llama_contextbb");
// and the head's own h_nextn of an output row, which a chained draft feeds back as its next h
float * swarm_llama_get_embeddings_nextn_ith(struct llama_context * ctx, int32_t i)
    __asm__("_Z30llama_get_embeddings_nextn_ithP13llama_contexti");

struct swarm_span {
    struct llama_model   * model;
    struct llama_context * ctx;
    llama_memory_t         mem;
    int32_t  n_embd;
    int32_t  n_vocab;
    int32_t  n_batch;        // effective llama_n_batch(ctx)
    int32_t  n_ubatch;       // effective llama_n_ubatch(ctx)
    uint32_t n_seq_max;
    bool     is_last;
    bool     require_tokens;  // the span's layers read token ids (swarm_span_params.require_token_ids)
    bool     step_tokens;     // steps must carry token ids: require_tokens, or the MTP head reads them
    char     capture[CAPTURE_NAME_MAX + 16];  // "<capture_name>-<layer>"

    // per-call batch arrays, sized n_batch
    llama_pos     * pos;
    int32_t       * n_seq_id;
    llama_seq_id ** seq_ptr;
    int8_t        * logits;
    llama_seq_id    seq_slot;  // every token of a step belongs to this one sequence

    // swarm_span_interrupt: set from any thread; read by interrupt_cb on the compute thread, which
    // stops a decode only while swarm_span_execute runs (`interruptible`), never a batch or the head
    atomic_int interrupt;
    bool       interruptible;

    // capture target of the current llama_decode
    float  * cap_dst;
    int64_t  cap_rows;        // rows written so far
    int64_t  cap_max_rows;
    int      cap_err;

    // swarm_span_execute_batch: one seq id per token (seq_ids[i]), pointed to by seq_ptrs[i],
    // and the captured rows of the whole batch before they are split back per step
    llama_seq_id  * seq_ids;
    llama_seq_id ** seq_ptrs;
    float         * cap_scratch;   // [n_batch, n_embd]; NULL on the last span
    llama_token   * tok_scratch;   // [n_batch] token ids of a batch's rows (require_tokens only)

    // positions llama.cpp reads per token of an embedding batch: GGML_MROPE_SECTIONS for M-RoPE
    // models (section-major, pos[j * n_tokens + i]), else 1; `pos` holds n_batch * 4 entries
    int32_t         n_pos_per_token;

    // the MTP head (swarm_span_params.mtp; NULL / unused without): its context and KV, the last
    // block's residual rows of the current decode (captured, [n_batch, n_embd]), the head's input
    // rows ([n_batch, n_embd]: h shifted by one position) and batch arrays of n_batch, and h of each
    // sequence's last position ([n_seq_max, n_embd], zeros for an empty sequence)
    struct llama_context * mtp_ctx;
    llama_memory_t         mtp_mem;
    float        * mtp_h;
    float        * mtp_rows;
    float        * mtp_pending;
    llama_token  * mtp_tok;
    llama_pos    * mtp_pos;
    int8_t       * mtp_logits;
    // per sequence, what the head was fed at its last mtp_ring positions: position p at slot
    // p % mtp_ring ([n_seq_max, mtp_ring] tokens, [n_seq_max, mtp_ring, n_embd] h inputs), valid
    // from mtp_ring_lo (the first position the ring still holds since the sequence was emptied or
    // imported) and within mtp_ring of the last position
    llama_token  * mtp_ring_tok;
    float        * mtp_ring_h;
    llama_pos    * mtp_ring_lo;
    // rows of each sequence the ring keeps: SWARM_MTP_MAX_DRAFTS, so swarm_span_mtp_draft_at can draft
    // after a verify pass of the head's longest chain whose drafts are all rejected; or, where the
    // span's cache truncates (mtp_truncate), SWARM_MTP_TRUNCATE_ROWS, so swarm_span_truncate can
    // cut a verify pass and one sent ahead of it back
    int32_t        mtp_ring;
    bool           mtp_truncate;
};

// One sequence's rows of an MTP feed: the next n rows of the captured h, at pos0.. of seq_id.
struct mtp_seg {
    int32_t         seq_id;
    int32_t         pos0;
    int32_t         n;
    const int32_t * tokens;
};

static void quiet_log(enum ggml_log_level level, const char * text, void * ud) {
    (void) level; (void) text; (void) ud;
}

static void init_once(void) {
    static int done = 0;
    if (done) {
        return;
    }
    done = 1;
    const char * want = getenv("SWARM_LLAMA_LOG");
    if (!want || !want[0]) {
        llama_log_set(quiet_log, NULL);
    }
    llama_backend_init();
}

// llama.cpp's abort callback (ggml-cpu asks it after each graph node): a decode it stops returns 2
// and llama.cpp drops the positions of that ubatch from the cache again (llama_context::decode).
static bool interrupt_cb(void * ud) {
    struct swarm_span * s = ud;
    return s->interruptible && atomic_load_explicit(&s->interrupt, memory_order_relaxed) != 0;
}

// Scheduler eval callback: observe only the boundary tensor and copy its rows out.
static bool capture_cb(struct ggml_tensor * t, bool ask, void * ud) {
    struct swarm_span * s = ud;
    if (strcmp(t->name, s->capture) != 0) {
        return !ask;  // not ours: do not observe (ask), keep computing (after)
    }
    if (ask) {
        return s->cap_dst != NULL;
    }
    // a row is [n_embd] or, for a hyper-connection residual (deepseek4), [n_embd / hc, hc]
    const int64_t rows = t->ne[0] == s->n_embd ? t->ne[1] * t->ne[2] * t->ne[3]
                       : t->ne[0] * t->ne[1] == s->n_embd ? t->ne[2] * t->ne[3] : -1;
    if (t->type != GGML_TYPE_F32 || rows < 0 || !ggml_is_contiguous(t) ||
        s->cap_rows + rows > s->cap_max_rows) {
        s->cap_err = 1;
        return true;
    }
    ggml_backend_tensor_get(t, s->cap_dst + s->cap_rows * s->n_embd, 0, ggml_nbytes(t));
    s->cap_rows += rows;
    return true;
}

static int alloc_batch(struct swarm_span * s) {
    size_t n = (size_t) s->n_batch;
    s->pos      = calloc(n * GGML_MROPE_SECTIONS, sizeof(*s->pos));  // room for M-RoPE sections
    s->n_seq_id = calloc(n, sizeof(*s->n_seq_id));
    s->seq_ptr  = calloc(n, sizeof(*s->seq_ptr));
    s->logits   = calloc(n, sizeof(*s->logits));
    if (!s->pos || !s->n_seq_id || !s->seq_ptr || !s->logits) {
        return SWARM_ERR_CONTEXT;
    }
    s->seq_ids  = calloc(n, sizeof(*s->seq_ids));
    s->seq_ptrs = calloc(n, sizeof(*s->seq_ptrs));
    if (!s->seq_ids || !s->seq_ptrs) {
        return SWARM_ERR_CONTEXT;
    }
    if (!s->is_last) {
        s->cap_scratch = malloc(n * (size_t) s->n_embd * sizeof(float));
        if (!s->cap_scratch) {
            return SWARM_ERR_CONTEXT;
        }
    }
    if (s->require_tokens) {
        s->tok_scratch = malloc(n * sizeof(*s->tok_scratch));
        if (!s->tok_scratch) {
            return SWARM_ERR_CONTEXT;
        }
    }
    if (s->mtp_ctx) {
        const size_t w = (size_t) s->n_embd;
        s->mtp_h       = malloc(n * w * sizeof(float));
        s->mtp_rows    = malloc(n * w * sizeof(float));
        s->mtp_pending = calloc((size_t) s->n_seq_max * w, sizeof(float));
        s->mtp_tok     = malloc(n * sizeof(*s->mtp_tok));
        s->mtp_pos     = malloc(n * GGML_MROPE_SECTIONS * sizeof(*s->mtp_pos));
        s->mtp_logits  = calloc(n, sizeof(*s->mtp_logits));
        const size_t ring = (size_t) s->n_seq_max * (size_t) s->mtp_ring;
        s->mtp_ring_tok = malloc(ring * sizeof(*s->mtp_ring_tok));
        s->mtp_ring_h   = malloc(ring * w * sizeof(float));
        s->mtp_ring_lo  = malloc((size_t) s->n_seq_max * sizeof(*s->mtp_ring_lo));
        if (!s->mtp_h || !s->mtp_rows || !s->mtp_pending || !s->mtp_tok || !s->mtp_pos || !s->mtp_logits ||
            !s->mtp_ring_tok || !s->mtp_ring_h || !s->mtp_ring_lo) {
            return SWARM_ERR_CONTEXT;
        }
        for (uint32_t q = 0; q < s->n_seq_max; q++) {
            s->mtp_ring_lo[q] = INT32_MAX;
        }
    }
    for (size_t i = 0; i < n; i++) {
        s->n_seq_id[i] = 1;
        s->seq_ptr[i]  = &s->seq_slot;
        s->seq_ptrs[i] = &s->seq_ids[i];
    }
    return SWARM_OK;
}

int swarm_span_open(const struct swarm_span_params * p, struct swarm_span ** out) {
    if (!out) {
        return SWARM_ERR_ARG;
    }
    *out = NULL;
    if (!p || !p->model_path || p->n_ctx == 0 || p->n_seq_max == 0 || p->n_seq_max > 256 ||
        p->n_threads < 1 || p->n_batch == 0 || p->n_ubatch == 0 || p->n_ubatch > p->n_batch ||
        p->flash_attn < -1 || p->flash_attn > 1) {
        return SWARM_ERR_ARG;
    }
    if (p->mtp < 0 || p->mtp > 2 || (p->mtp != 0 && !p->is_last) || p->mtp_truncate < 0 ||
        p->mtp_truncate > 1) {
        return SWARM_ERR_ARG;  // the head follows the model's last layer
    }
    // a non-last span captures its boundary, an MTP span the rows its head reads: the last block's
    // residual (mtp 1) or h_nextn (mtp 2, named without a layer: llama.cpp's cb with il = -1)
    const bool captures = !p->is_last || p->mtp;
    const bool names_block = !p->is_last || p->mtp == 1;
    if (names_block && (!p->capture_name || strlen(p->capture_name) > CAPTURE_NAME_MAX ||
                        p->capture_layer < 0)) {
        return SWARM_ERR_ARG;
    }
    init_once();

    struct swarm_span * s = calloc(1, sizeof(*s));
    if (!s) {
        return SWARM_ERR_CONTEXT;
    }
    s->is_last   = p->is_last != 0;
    s->require_tokens = p->require_token_ids != 0;
    s->step_tokens    = s->require_tokens || p->mtp;
    s->mtp_truncate   = p->mtp && p->mtp_truncate;
    s->mtp_ring       = s->mtp_truncate ? SWARM_MTP_TRUNCATE_ROWS : SWARM_MTP_MAX_DRAFTS;
    s->n_seq_max = p->n_seq_max;
    if (names_block) {
        snprintf(s->capture, sizeof(s->capture), "%s-%d", p->capture_name, p->capture_layer);
    } else if (captures) {
        snprintf(s->capture, sizeof(s->capture), "h_nextn");
    }

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mtp     = p->mtp != 0;
    s->model = llama_model_load_from_file(p->model_path, mp);
    if (!s->model) {
        free(s);
        return SWARM_ERR_LOAD;
    }
    // llama.cpp's MTP graphs run one appended block (deepseek4 asserts it); more would abort there
    if (p->mtp && llama_model_n_layer_nextn(s->model) != 1) {
        swarm_span_close(s);
        return SWARM_ERR_ARG;
    }
    s->n_embd  = llama_model_n_embd_inp(s->model);
    {
        const enum llama_rope_type rt = llama_model_rope_type(s->model);
        const bool mrope = rt == LLAMA_ROPE_TYPE_MROPE || rt == LLAMA_ROPE_TYPE_IMROPE;
        s->n_pos_per_token = mrope ? GGML_MROPE_SECTIONS : 1;
    }
    s->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(s->model));
    // the head reads rows of the captured residual: they must be as wide as its h input
    if ((names_block && p->capture_layer >= llama_model_n_layer(s->model)) ||
        (p->mtp && llama_model_n_embd_out(s->model) != s->n_embd)) {
        swarm_span_close(s);
        return SWARM_ERR_ARG;
    }

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = p->n_ctx;
    cp.n_batch         = p->n_batch;
    cp.n_ubatch        = p->n_ubatch;
    cp.n_seq_max       = p->n_seq_max;
    // One-row ubatches (decode steps) run on 1 thread, multi-row ones on n_threads (llama.cpp picks
    // n_threads for a ubatch of one token, n_threads_batch otherwise). ggml's CPU flash attention
    // splits a one-row query's KV cells across the threads once the view holds >= 512 cells and sums
    // the partials, so a decode step's logits would depend on the thread count (measured by
    // scripts/numeric_threads.py: up to 1.3 logits on SmolLM2); multi-row ubatches split by rows
    // and do not.
    // The numeric contract (swarm/numeric.py) decodes at 1 thread on every path.
    cp.n_threads       = 1;
    cp.n_threads_batch = p->n_threads;
    cp.flash_attn_type = (enum llama_flash_attn_type) p->flash_attn;
    // One KV stream per sequence (n_ctx / n_seq_max cells each): a sequence's cells start at cell 0
    // of its own stream whatever the other sequences hold, so its results equal a solo run. With
    // one shared (unified) stream, where a sequence's cells land changes its numbers (csrc/README.md).
    cp.kv_unified      = false;
    cp.embeddings      = false;
    cp.no_perf         = true;
    if (captures) {
        cp.cb_eval           = capture_cb;
        cp.cb_eval_user_data = s;
    }
    s->ctx = llama_init_from_model(s->model, cp);
    if (!s->ctx) {
        swarm_span_close(s);
        return SWARM_ERR_CONTEXT;
    }
    llama_set_abort_callback(s->ctx, interrupt_cb, s);
    if (p->mtp == 2) {
        // h_nextn of every row, not only of the rows whose logits a step asks for: some graphs
        // (deepseek2, glm-dsa) otherwise cut the last block down to the output rows
        swarm_llama_set_embeddings_nextn(s->ctx, true, false);
    }
    if (p->mtp) {
        // the head's own context on the same model: same sizes and threads, one KV stream per
        // sequence over the MTP block only; it reads its h rows from the batch, so no callback
        cp.cb_eval           = NULL;
        cp.cb_eval_user_data = NULL;
        cp.ctx_type          = LLAMA_CONTEXT_TYPE_MTP;
        s->mtp_ctx = llama_init_from_model(s->model, cp);
        if (!s->mtp_ctx) {
            swarm_span_close(s);
            return SWARM_ERR_CONTEXT;
        }
        s->mtp_mem = llama_get_memory(s->mtp_ctx);
        // the h_nextn of a draft row (its output row only): the next chained draft's h
        swarm_llama_set_embeddings_nextn(s->mtp_ctx, true, true);
    }
    s->mem     = llama_get_memory(s->ctx);
    s->n_batch  = (int32_t) llama_n_batch(s->ctx);
    s->n_ubatch = (int32_t) llama_n_ubatch(s->ctx);
    if (alloc_batch(s) != SWARM_OK) {
        swarm_span_close(s);
        return SWARM_ERR_CONTEXT;
    }
    *out = s;
    return SWARM_OK;
}

void swarm_span_close(struct swarm_span * s) {
    if (!s) {
        return;
    }
    if (s->mtp_ctx) {
        llama_free(s->mtp_ctx);
    }
    if (s->ctx) {
        llama_free(s->ctx);
    }
    if (s->model) {
        llama_model_free(s->model);
    }
    free(s->pos);
    free(s->n_seq_id);
    free(s->seq_ptr);
    free(s->logits);
    free(s->seq_ids);
    free(s->seq_ptrs);
    free(s->cap_scratch);
    free(s->tok_scratch);
    free(s->mtp_h);
    free(s->mtp_rows);
    free(s->mtp_pending);
    free(s->mtp_tok);
    free(s->mtp_pos);
    free(s->mtp_logits);
    free(s->mtp_ring_tok);
    free(s->mtp_ring_h);
    free(s->mtp_ring_lo);
    free(s);
}

void swarm_span_interrupt(struct swarm_span * s, int32_t on) {
    if (s) {
        atomic_store_explicit(&s->interrupt, on != 0, memory_order_relaxed);
    }
}

int32_t swarm_span_n_embd(const struct swarm_span * s)  { return s ? s->n_embd : 0; }
int32_t swarm_span_n_vocab(const struct swarm_span * s) { return s ? s->n_vocab : 0; }
int32_t swarm_span_n_ctx(const struct swarm_span * s)   { return s ? (int32_t) llama_n_ctx(s->ctx) : 0; }
int32_t swarm_span_n_ctx_seq(const struct swarm_span * s) { return s ? (int32_t) llama_n_ctx_seq(s->ctx) : 0; }

static int check_seq(const struct swarm_span * s, int32_t seq_id) {
    if (!s) {
        return SWARM_ERR_ARG;
    }
    return (seq_id < 0 || (uint32_t) seq_id >= s->n_seq_max) ? SWARM_ERR_SEQ : SWARM_OK;
}

// M-RoPE: llama.cpp reads an embedding batch's positions section-major (pos[j * n + i]) as given,
// but turns a token batch's one position p into (p, p, p, 0) (llm_graph_input_pos::set_input);
// give text positions exactly that way, so a span equals the whole model fed token ids.
static void spread_pos_of(const struct swarm_span * s, llama_pos * pos, int32_t n) {
    for (int32_t j = 1; j < s->n_pos_per_token; j++) {
        if (j < 3) {
            memcpy(pos + (size_t) j * n, pos, sizeof(*pos) * (size_t) n);
        } else {
            memset(pos + (size_t) j * n, 0, sizeof(*pos) * (size_t) n);
        }
    }
}

static void spread_pos(struct swarm_span * s, int32_t n) {
    spread_pos_of(s, s->pos, n);
}

static int map_decode_rc(int rc) {
    return rc == 1 ? SWARM_ERR_KV_FULL : rc == 2 ? SWARM_ERR_INTERRUPTED : SWARM_ERR_DECODE;
}

// Empties seq_id in the span's cache and, with a head, in the head's (and its pending h).
static void clear_seq(struct swarm_span * s, int32_t seq_id) {
    llama_memory_seq_rm(s->mem, seq_id, -1, -1);
    if (s->mtp_ctx) {
        llama_memory_seq_rm(s->mtp_mem, seq_id, -1, -1);
        memset(s->mtp_pending + (size_t) seq_id * s->n_embd, 0, sizeof(float) * (size_t) s->n_embd);
        s->mtp_ring_lo[seq_id] = INT32_MAX;
    }
}

// Undoes a failed step of n rows of seq_id from pos0 in the span's cache and the head's (its pending
// h back to saved). A cache that cannot drop those positions (deepseek4's compressed cache keeps few
// recent positions) would leave the sequence half-advanced, and the head out of step: it is emptied
// instead.
static void undo_step(struct swarm_span * s, int32_t seq_id, int32_t pos0, int32_t n, const float * saved) {
    bool ok = llama_memory_seq_rm(s->mem, seq_id, pos0, -1);
    if (s->mtp_ctx) {
        ok = llama_memory_seq_rm(s->mtp_mem, seq_id, pos0, -1) && ok;
        memcpy(s->mtp_pending + (size_t) seq_id * s->n_embd, saved, sizeof(float) * (size_t) s->n_embd);
        // rows the step fed took the ring slots of positions pos0 - ring .. pos0 + n - 1 - ring
        const llama_pos kept = pos0 + n - s->mtp_ring;
        if (kept > s->mtp_ring_lo[seq_id]) {
            s->mtp_ring_lo[seq_id] = kept;
        }
    }
    if (!ok) {
        clear_seq(s, seq_id);
    }
}

// Decodes the head's batch of n rows (mtp_tok, mtp_rows, mtp_pos, seq_ids and mtp_logits filled),
// positions spread for M-RoPE. Returns llama_decode's status.
static int mtp_decode(struct swarm_span * s, int32_t n) {
    struct llama_batch b = {
        .n_tokens = n,
        .token    = s->mtp_tok,
        .embd     = s->mtp_rows,
        .pos      = s->mtp_pos,
        .n_seq_id = s->n_seq_id,
        .seq_id   = s->seq_ptrs,
        .logits   = s->mtp_logits,
    };
    spread_pos_of(s, s->mtp_pos, n);
    return llama_decode(s->mtp_ctx, b);
}

// The head's logits [n_vocab] into out for `token` at `pos` of seq_id paired with h (h of pos - 1);
// pos is removed from the head's cache again: a draft is not the sequence's row.
static int32_t argmax_f32(const float * row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (row[i] > row[best]) {
            best = i;
        }
    }
    return best;
}

// Up to n drafts from `token` at pos with the head input h, chained as common/speculative.cpp's
// draft-mtp driver chains one head: draft i + 1 feeds draft i's greedy token (first maximum) at the
// next position with the head's own h_nextn of draft i's row. The rows stay in the head's cache
// while the chain runs (later drafts attend to them) and are removed at the end. *made: the drafts
// whose logits are in out ([n, n_vocab]); a chain that runs out of KV cells after its first draft
// stops there without an error.
static int mtp_draft_rows(struct swarm_span * s, int32_t seq_id, int32_t token, llama_pos pos,
                          const float * h, int32_t n, float * out, int32_t * made) {
    const size_t w = (size_t) s->n_embd;
    int rc = SWARM_OK;
    *made = 0;
    memcpy(s->mtp_rows, h, sizeof(float) * w);
    for (int32_t i = 0; i < n; i++) {
        s->mtp_tok[0]    = token;
        s->mtp_pos[0]    = pos + i;
        s->seq_ids[0]    = seq_id;
        s->mtp_logits[0] = 1;
        const int d = mtp_decode(s, 1);
        const float * lg = d == 0 ? llama_get_logits_ith(s->mtp_ctx, 0) : NULL;
        const float * hn = lg && i + 1 < n ? swarm_llama_get_embeddings_nextn_ith(s->mtp_ctx, 0) : NULL;
        if (lg) {
            memcpy(out + (size_t) i * (size_t) s->n_vocab, lg, sizeof(float) * (size_t) s->n_vocab);
            *made = i + 1;
        }
        if (!lg || i + 1 == n || !hn) {
            rc = i > 0 ? SWARM_OK : d != 0 ? map_decode_rc(d) : lg ? SWARM_OK : SWARM_ERR_DECODE;
            break;
        }
        token = argmax_f32(out + (size_t) i * (size_t) s->n_vocab, s->n_vocab);
        memcpy(s->mtp_rows, hn, sizeof(float) * w);
    }
    llama_memory_seq_rm(s->mtp_mem, seq_id, pos, -1);
    return rc;
}

// Feeds the MTP head the rows the span just decoded, segment after segment (their h captured in
// mtp_h in that order): row i of a segment is its token at pos0 + i with h of the row before it
// (the sequence's pending h for the first row), as common/speculative.cpp pairs them; then each
// segment's last h becomes its sequence's pending h. One llama_decode, no outputs.
static int mtp_feed(struct swarm_span * s, const struct mtp_seg * segs, int32_t n_segs) {
    const size_t w = (size_t) s->n_embd;
    int32_t t = 0;
    for (int32_t k = 0; k < n_segs; k++) {
        const struct mtp_seg * g = &segs[k];
        for (int32_t i = 0; i < g->n; i++, t++) {
            const float * h = i == 0 ? s->mtp_pending + (size_t) g->seq_id * w : s->mtp_h + (size_t) (t - 1) * w;
            memcpy(s->mtp_rows + (size_t) t * w, h, w * sizeof(float));
            s->mtp_tok[t]    = g->tokens[i];
            s->mtp_pos[t]    = g->pos0 + i;
            s->seq_ids[t]    = g->seq_id;
            s->mtp_logits[t] = 0;
        }
    }
    int rc = mtp_decode(s, t);
    if (rc != 0) {
        return map_decode_rc(rc);
    }
    t = 0;
    for (int32_t k = 0; k < n_segs; k++) {
        const struct mtp_seg * g = &segs[k];
        const int32_t r = s->mtp_ring;
        for (int32_t i = g->n > r ? g->n - r : 0; i < g->n; i++) {  // what the ring keeps
            const size_t slot = (size_t) g->seq_id * (size_t) r + (size_t) ((g->pos0 + i) % r);
            s->mtp_ring_tok[slot] = g->tokens[i];
            memcpy(s->mtp_ring_h + slot * w, s->mtp_rows + (size_t) (t + i) * w, w * sizeof(float));
        }
        if (g->pos0 < s->mtp_ring_lo[g->seq_id]) {
            s->mtp_ring_lo[g->seq_id] = g->pos0;
        }
        t += g->n;
        memcpy(s->mtp_pending + (size_t) g->seq_id * w, s->mtp_h + (size_t) (t - 1) * w, w * sizeof(float));
    }
    return SWARM_OK;
}

// Points the capture callback at dst for n rows (a non-last span's boundary, or the head's h).
static void capture_into(struct swarm_span * s, float * dst, int64_t n) {
    s->cap_dst      = dst;
    s->cap_rows     = 0;
    s->cap_max_rows = n;
    s->cap_err      = 0;
}

// Decode tokens [off, off + n) of the step; fills the matching rows of step->out.
static int decode_chunk(struct swarm_span * s, const struct swarm_span_step * st, int32_t off, int32_t n,
                        bool final_chunk) {
    for (int32_t i = 0; i < n; i++) {
        s->pos[i] = st->pos0 + off + i;
        s->logits[i] = s->is_last ? (int8_t) (st->all_logits || (final_chunk && i == n - 1)) : 1;
    }
    struct llama_batch b = {
        .n_tokens = n,
        .token    = s->require_tokens ? (llama_token *) st->token_ids + off : NULL,
        .embd     = (float *) st->embd + (size_t) off * s->n_embd,
        .pos      = s->pos,
        .n_seq_id = s->n_seq_id,
        .seq_id   = s->seq_ptr,
        .logits   = s->logits,
    };
    if (!s->is_last) {
        capture_into(s, st->out + (size_t) off * s->n_embd, n);
    } else if (s->mtp_ctx) {
        capture_into(s, s->mtp_h, n);
    }
    spread_pos(s, b.n_tokens);
    int rc = llama_decode(s->ctx, b);
    s->cap_dst = NULL;
    if (rc != 0) {
        return map_decode_rc(rc);
    }
    if (!s->is_last || s->mtp_ctx) {
        if (s->cap_err || s->cap_rows != n) {
            return SWARM_ERR_CAPTURE;
        }
        if (!s->is_last) {
            return SWARM_OK;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        if (!s->logits[i]) {
            continue;
        }
        const float * lg = llama_get_logits_ith(s->ctx, i);
        if (!lg) {
            return SWARM_ERR_DECODE;
        }
        size_t row = st->all_logits ? (size_t) (off + i) : 0;
        memcpy(st->out + row * s->n_vocab, lg, sizeof(float) * (size_t) s->n_vocab);
    }
    if (s->mtp_ctx) {
        const struct mtp_seg seg = { st->seq_id, st->pos0 + off, n, st->token_ids + off };
        return mtp_feed(s, &seg, 1);
    }
    return SWARM_OK;
}

int swarm_span_execute(struct swarm_span * s, const struct swarm_span_step * st) {
    if (!s || !st || !st->embd || !st->out || st->n_tokens < 1 || st->pos0 < 0 ||
        (s->step_tokens && !st->token_ids) ||
        st->pos0 > INT32_MAX - st->n_tokens) {
        return SWARM_ERR_ARG;
    }
    int rc = check_seq(s, st->seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    size_t width = s->is_last ? (size_t) s->n_vocab : (size_t) s->n_embd;
    size_t rows  = (!s->is_last || st->all_logits) ? (size_t) st->n_tokens : 1;
    if (st->out_cap < rows * width) {
        return SWARM_ERR_BUF;
    }
    if (st->pos0 != llama_memory_seq_pos_max(s->mem, st->seq_id) + 1) {
        return SWARM_ERR_POS;
    }
    float * saved = NULL;  // the head's pending h before the step, restored on failure
    if (s->mtp_ctx) {
        saved = malloc(sizeof(float) * (size_t) s->n_embd);
        if (!saved) {
            return SWARM_ERR_DECODE;
        }
        memcpy(saved, s->mtp_pending + (size_t) st->seq_id * s->n_embd, sizeof(float) * (size_t) s->n_embd);
    }
    s->seq_slot = st->seq_id;
    s->interruptible = true;
    for (int32_t off = 0; off < st->n_tokens && rc == SWARM_OK; off += s->n_batch) {
        int32_t n = st->n_tokens - off < s->n_batch ? st->n_tokens - off : s->n_batch;
        rc = decode_chunk(s, st, off, n, off + n == st->n_tokens);
    }
    s->interruptible = false;
    if (rc != SWARM_OK) {
        undo_step(s, st->seq_id, st->pos0, st->n_tokens, saved);
    }
    free(saved);
    return rc;
}

// Checks one step of a batch: arguments, sequence id, output capacity, position continuity.
static int check_step(struct swarm_span * s, const struct swarm_span_step * st) {
    if (!st->embd || !st->out || st->n_tokens < 1 || st->pos0 < 0 || st->pos0 > INT32_MAX - st->n_tokens ||
        (s->step_tokens && !st->token_ids)) {
        return SWARM_ERR_ARG;
    }
    int rc = check_seq(s, st->seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    size_t width = s->is_last ? (size_t) s->n_vocab : (size_t) s->n_embd;
    size_t rows  = (!s->is_last || st->all_logits) ? (size_t) st->n_tokens : 1;
    if (st->out_cap < rows * width) {
        return SWARM_ERR_BUF;
    }
    return st->pos0 == llama_memory_seq_pos_max(s->mem, st->seq_id) + 1 ? SWARM_OK : SWARM_ERR_POS;
}

// Copies one group's output rows back into its steps' out buffers: the group is steps[order[g0..g1)],
// decoded in that order as one ubatch, so its rows come sequence after sequence.
static int split_outputs(struct swarm_span * s, const struct swarm_span_step * steps, const int32_t * order,
                         int32_t g0, int32_t g1) {
    int32_t row = 0;
    for (int32_t k = g0; k < g1; k++) {
        const struct swarm_span_step * st = &steps[order[k]];
        if (!s->is_last) {
            memcpy(st->out, s->cap_scratch + (size_t) row * s->n_embd,
                   sizeof(float) * (size_t) st->n_tokens * (size_t) s->n_embd);
            row += st->n_tokens;
            continue;
        }
        for (int32_t i = 0; i < st->n_tokens; i++, row++) {
            if (!s->logits[row]) {
                continue;
            }
            const float * lg = llama_get_logits_ith(s->ctx, row);
            if (!lg) {
                return SWARM_ERR_DECODE;
            }
            size_t dst = st->all_logits ? (size_t) i : 0;
            memcpy(st->out + dst * s->n_vocab, lg, sizeof(float) * (size_t) s->n_vocab);
        }
    }
    return SWARM_OK;
}

// Decodes the group steps[order[g0..g1)] in one llama_decode call; embd has room for its rows.
static int decode_group(struct swarm_span * s, const struct swarm_span_step * steps, const int32_t * order,
                        int32_t g0, int32_t g1, float * embd) {
    int32_t t = 0;
    for (int32_t k = g0; k < g1; k++) {
        const struct swarm_span_step * st = &steps[order[k]];
        memcpy(embd + (size_t) t * s->n_embd, st->embd, sizeof(float) * (size_t) st->n_tokens * s->n_embd);
        if (s->require_tokens) {
            memcpy(s->tok_scratch + t, st->token_ids, sizeof(*s->tok_scratch) * (size_t) st->n_tokens);
        }
        for (int32_t i = 0; i < st->n_tokens; i++, t++) {
            s->pos[t]     = st->pos0 + i;
            s->seq_ids[t] = st->seq_id;
            s->logits[t]  = s->is_last ? (int8_t) (st->all_logits || i == st->n_tokens - 1) : 1;
        }
    }
    struct llama_batch b = {
        .n_tokens = t,
        .token    = s->require_tokens ? s->tok_scratch : NULL,
        .embd     = embd,
        .pos      = s->pos,
        .n_seq_id = s->n_seq_id,
        .seq_id   = s->seq_ptrs,
        .logits   = s->logits,
    };
    if (!s->is_last) {
        capture_into(s, s->cap_scratch, t);
    } else if (s->mtp_ctx) {
        capture_into(s, s->mtp_h, t);
    }
    spread_pos(s, b.n_tokens);
    int rc = llama_decode(s->ctx, b);
    s->cap_dst = NULL;
    if (rc != 0) {
        return map_decode_rc(rc);
    }
    if ((!s->is_last || s->mtp_ctx) && (s->cap_err || s->cap_rows != t)) {
        return SWARM_ERR_CAPTURE;
    }
    rc = split_outputs(s, steps, order, g0, g1);
    if (rc != SWARM_OK || !s->mtp_ctx) {
        return rc;
    }
    struct mtp_seg segs[256];  // g1 - g0 <= n_steps <= 256
    for (int32_t k = g0; k < g1; k++) {
        const struct swarm_span_step * st = &steps[order[k]];
        segs[k - g0] = (struct mtp_seg) { st->seq_id, st->pos0, st->n_tokens, st->token_ids };
    }
    return mtp_feed(s, segs, g1 - g0);
}

int swarm_span_execute_batch(struct swarm_span * s, const struct swarm_span_step * steps, int32_t n_steps) {
    if (!s || !steps || n_steps < 1 || (uint32_t) n_steps > s->n_seq_max) {
        return SWARM_ERR_ARG;
    }
    int32_t total = 0;
    for (int32_t k = 0; k < n_steps; k++) {
        int rc = check_step(s, &steps[k]);
        if (rc != SWARM_OK) {
            return rc;
        }
        for (int32_t j = 0; j < k; j++) {
            if (steps[j].seq_id == steps[k].seq_id) {
                return SWARM_ERR_ARG;  // two steps of one sequence would race for its positions
            }
        }
        if (steps[k].n_tokens > s->n_batch - total) {
            return SWARM_ERR_ARG;  // the caller splits: at most n_batch rows per call
        }
        total += steps[k].n_tokens;
    }
    // With one KV stream per sequence, llama.cpp puts only sequences of consecutive ids, with equal
    // token counts, in one ubatch (split_equal, sequential), and the capture callback sees rows
    // ubatch by ubatch. So: order the steps by seq id and decode each run of consecutive ids with
    // equal n_tokens (and at most n_ubatch rows) as its own llama_decode call, which is exactly one
    // ubatch with rows in that order.
    int32_t order[256];  // n_steps <= n_seq_max <= 256
    for (int32_t k = 0; k < n_steps; k++) {
        int32_t j = k;
        while (j > 0 && steps[order[j - 1]].seq_id > steps[k].seq_id) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = k;
    }
    float * embd = malloc(sizeof(float) * (size_t) total * (size_t) s->n_embd);
    // the head's pending h of every step's sequence before the batch, restored on failure
    float * saved = s->mtp_ctx ? malloc(sizeof(float) * (size_t) n_steps * (size_t) s->n_embd) : NULL;
    if (!embd || (s->mtp_ctx && !saved)) {
        free(embd);
        free(saved);
        return SWARM_ERR_DECODE;
    }
    for (int32_t k = 0; saved && k < n_steps; k++) {
        memcpy(saved + (size_t) k * s->n_embd, s->mtp_pending + (size_t) steps[k].seq_id * s->n_embd,
               sizeof(float) * (size_t) s->n_embd);
    }
    int rc = SWARM_OK;
    for (int32_t g0 = 0; g0 < n_steps && rc == SWARM_OK;) {
        const int32_t n = steps[order[g0]].n_tokens;
        int32_t g1 = g0 + 1;
        while (g1 < n_steps && steps[order[g1]].seq_id == steps[order[g1 - 1]].seq_id + 1 &&
               steps[order[g1]].n_tokens == n && (g1 - g0 + 1) * n <= s->n_ubatch) {
            g1++;
        }
        rc = decode_group(s, steps, order, g0, g1, embd);
        g0 = g1;
    }
    free(embd);
    if (rc != SWARM_OK) {
        for (int32_t k = 0; k < n_steps; k++) {
            undo_step(s, steps[k].seq_id, steps[k].pos0, steps[k].n_tokens,
                      saved ? saved + (size_t) k * s->n_embd : NULL);
        }
    }
    free(saved);
    return rc;
}

// the checks common to both drafts' arguments
static int mtp_draft_args(const struct swarm_span * s, int32_t seq_id, int32_t token, int32_t n_draft,
                          const float * out, size_t out_cap, const int32_t * n_made) {
    const int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    if (!s->mtp_ctx || !out || !n_made || token < 0 || token >= s->n_vocab || n_draft < 1 ||
        n_draft > SWARM_MTP_MAX_DRAFTS) {
        return SWARM_ERR_ARG;
    }
    return out_cap < (size_t) n_draft * (size_t) s->n_vocab ? SWARM_ERR_BUF : SWARM_OK;
}

int swarm_span_mtp_draft(struct swarm_span * s, int32_t seq_id, int32_t token, int32_t n_draft, float * out,
                         size_t out_cap, int32_t * n_made) {
    int rc = mtp_draft_args(s, seq_id, token, n_draft, out, out_cap, n_made);
    if (rc != SWARM_OK) {
        return rc;
    }
    *n_made = 0;
    const llama_pos last = llama_memory_seq_pos_max(s->mem, seq_id);
    if (last < 0) {
        return SWARM_ERR_POS;  // no position yet: no h to draft from
    }
    if (llama_memory_seq_pos_max(s->mtp_mem, seq_id) != last) {
        return SWARM_ERR_STATE;
    }
    // the next step feeds the head its real row at last + 1
    return mtp_draft_rows(s, seq_id, token, last + 1, s->mtp_pending + (size_t) seq_id * s->n_embd, n_draft,
                          out, n_made);
}

int swarm_span_mtp_draft_at(struct swarm_span * s, int32_t seq_id, int32_t token, int32_t pos,
                            int32_t n_draft, float * out, size_t out_cap, int32_t * n_made) {
    int rc = mtp_draft_args(s, seq_id, token, n_draft, out, out_cap, n_made);
    if (rc != SWARM_OK) {
        return rc;
    }
    const llama_pos last = llama_memory_seq_pos_max(s->mem, seq_id);
    if (pos == last + 1) {
        return swarm_span_mtp_draft(s, seq_id, token, n_draft, out, out_cap, n_made);
    }
    *n_made = 0;
    const int32_t n_back = last - pos + 1;  // the positions pos..last the head holds, fed again after
    if (pos < 1 || n_back < 1) {
        return SWARM_ERR_POS;
    }
    if (n_back > s->mtp_ring || n_back > s->n_batch || pos < s->mtp_ring_lo[seq_id]) {
        return SWARM_ERR_NOT_HELD;
    }
    if (llama_memory_seq_pos_max(s->mtp_mem, seq_id) != last) {
        return SWARM_ERR_STATE;
    }
    const size_t w = (size_t) s->n_embd;
    const size_t base = (size_t) seq_id * (size_t) s->mtp_ring;
    // the token at pos with h of pos - 1: what the head was fed at pos, with another token
    llama_memory_seq_rm(s->mtp_mem, seq_id, pos, -1);
    const float * h = s->mtp_ring_h + (base + (size_t) (pos % s->mtp_ring)) * w;
    rc = mtp_draft_rows(s, seq_id, token, pos, h, n_draft, out, n_made);
    // the rows at pos..last again, as they were fed: the head's cache holds the span's positions
    for (int32_t i = 0; i < n_back; i++) {
        const size_t slot = base + (size_t) ((pos + i) % s->mtp_ring);
        s->mtp_tok[i]    = s->mtp_ring_tok[slot];
        s->mtp_pos[i]    = pos + i;
        s->seq_ids[i]    = seq_id;
        s->mtp_logits[i] = 0;
        memcpy(s->mtp_rows + (size_t) i * w, s->mtp_ring_h + slot * w, w * sizeof(float));
    }
    if (mtp_decode(s, n_back) != 0) {
        clear_seq(s, seq_id);  // the head could not follow the span: neither keeps the sequence
        *n_made = 0;
        return SWARM_ERR_DECODE;
    }
    return rc;
}

int swarm_span_truncate(struct swarm_span * s, int32_t seq_id, int32_t pos) {
    int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    if (pos < 0) {
        return SWARM_ERR_ARG;
    }
    if (s->mtp_ctx) {
        const llama_pos last = llama_memory_seq_pos_max(s->mem, seq_id);
        if (pos == 0) {
            clear_seq(s, seq_id);
            return SWARM_OK;
        }
        if (pos > last) {
            return SWARM_OK;
        }
        // the head goes on from pos with the h it was fed there (h of pos - 1): only from the ring
        if (!s->mtp_truncate) {
            return SWARM_ERR_STATE;
        }
        const llama_pos lo = last + 1 - s->mtp_ring > s->mtp_ring_lo[seq_id] ? last + 1 - s->mtp_ring
                                                                             : s->mtp_ring_lo[seq_id];
        if (pos < lo) {
            return SWARM_ERR_NOT_HELD;
        }
        if (!llama_memory_seq_rm(s->mem, seq_id, pos, -1)) {
            return SWARM_ERR_STATE;
        }
        llama_memory_seq_rm(s->mtp_mem, seq_id, pos, -1);
        const size_t w = (size_t) s->n_embd;
        const size_t slot = (size_t) seq_id * (size_t) s->mtp_ring + (size_t) (pos % s->mtp_ring);
        memcpy(s->mtp_pending + (size_t) seq_id * w, s->mtp_ring_h + slot * w, w * sizeof(float));
        s->mtp_ring_lo[seq_id] = lo;  // slots before lo hold later positions: no longer readable
        return SWARM_OK;
    }
    return llama_memory_seq_rm(s->mem, seq_id, pos, -1) ? SWARM_OK : SWARM_ERR_STATE;
}

int swarm_span_clear(struct swarm_span * s, int32_t seq_id) {
    int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    clear_seq(s, seq_id);
    return SWARM_OK;
}

int32_t swarm_span_seq_pos_max(struct swarm_span * s, int32_t seq_id) {
    int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    return llama_memory_seq_pos_max(s->mem, seq_id);
}

// The frame of an MTP handle's sequence state: magic, u64 span bytes, u64 head bytes, the span's
// llama.cpp state, the head's, then the pending h row (n_embd float32).
static const char MTP_MAGIC[8] = { 'S', 'W', 'M', 'T', 'P', '0', '0', '1' };
#define MTP_FRAME_HEAD (sizeof(MTP_MAGIC) + 2 * sizeof(uint64_t))

size_t swarm_span_state_size(struct swarm_span * s, int32_t seq_id) {
    if (check_seq(s, seq_id) != SWARM_OK) {
        return 0;
    }
    size_t n = llama_state_seq_get_size(s->ctx, seq_id);
    if (s->mtp_ctx) {
        n += MTP_FRAME_HEAD + llama_state_seq_get_size(s->mtp_ctx, seq_id) + sizeof(float) * (size_t) s->n_embd;
    }
    return n;
}

int swarm_span_state_get(struct swarm_span * s, int32_t seq_id, uint8_t * buf, size_t cap, size_t * written) {
    int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    if (!buf || !written) {
        return SWARM_ERR_ARG;
    }
    *written = 0;
    if (cap < swarm_span_state_size(s, seq_id)) {
        return SWARM_ERR_BUF;
    }
    if (!s->mtp_ctx) {
        size_t n = llama_state_seq_get_data(s->ctx, buf, cap, seq_id);
        if (n == 0) {
            return SWARM_ERR_STATE;
        }
        *written = n;
        return SWARM_OK;
    }
    uint8_t * p = buf + MTP_FRAME_HEAD;
    const size_t nt = llama_state_seq_get_data(s->ctx, p, cap - MTP_FRAME_HEAD, seq_id);
    if (nt == 0) {
        return SWARM_ERR_STATE;
    }
    p += nt;
    const size_t row = sizeof(float) * (size_t) s->n_embd;
    const size_t nm = llama_state_seq_get_data(s->mtp_ctx, p, cap - MTP_FRAME_HEAD - nt - row, seq_id);
    if (nm == 0) {
        return SWARM_ERR_STATE;
    }
    memcpy(p + nm, s->mtp_pending + (size_t) seq_id * s->n_embd, row);
    const uint64_t lens[2] = { nt, nm };
    memcpy(buf, MTP_MAGIC, sizeof(MTP_MAGIC));
    memcpy(buf + sizeof(MTP_MAGIC), lens, sizeof(lens));
    *written = MTP_FRAME_HEAD + nt + nm + row;
    return SWARM_OK;
}

// Loads an MTP frame (see swarm_span_state_get) into the empty seq_id of both caches.
static int mtp_state_set(struct swarm_span * s, int32_t seq_id, const uint8_t * buf, size_t n) {
    const size_t row = sizeof(float) * (size_t) s->n_embd;
    uint64_t lens[2];
    if (n < MTP_FRAME_HEAD + row || memcmp(buf, MTP_MAGIC, sizeof(MTP_MAGIC)) != 0) {
        return SWARM_ERR_STATE;
    }
    memcpy(lens, buf + sizeof(MTP_MAGIC), sizeof(lens));
    const size_t body = n - MTP_FRAME_HEAD - row;
    if (lens[0] == 0 || lens[1] == 0 || lens[0] > body || lens[1] != body - lens[0]) {
        return SWARM_ERR_STATE;
    }
    const uint8_t * p = buf + MTP_FRAME_HEAD;
    if (llama_state_seq_set_data(s->ctx, p, (size_t) lens[0], seq_id) != lens[0] ||
        llama_state_seq_set_data(s->mtp_ctx, p + lens[0], (size_t) lens[1], seq_id) != lens[1] ||
        llama_memory_seq_pos_max(s->mem, seq_id) != llama_memory_seq_pos_max(s->mtp_mem, seq_id)) {
        return SWARM_ERR_STATE;
    }
    memcpy(s->mtp_pending + (size_t) seq_id * s->n_embd, p + lens[0] + lens[1], row);
    s->mtp_ring_lo[seq_id] = INT32_MAX;  // a state carries the head's last h only
    return SWARM_OK;
}

int swarm_span_state_set(struct swarm_span * s, int32_t seq_id, const uint8_t * buf, size_t n) {
    int rc = check_seq(s, seq_id);
    if (rc != SWARM_OK) {
        return rc;
    }
    if (!buf || n == 0) {
        return SWARM_ERR_ARG;
    }
    if (llama_memory_seq_pos_max(s->mem, seq_id) != -1 ||
        (s->mtp_ctx && llama_memory_seq_pos_max(s->mtp_mem, seq_id) != -1)) {
        return SWARM_ERR_NOT_EMPTY;
    }
    rc = s->mtp_ctx ? mtp_state_set(s, seq_id, buf, n)
                    : (llama_state_seq_set_data(s->ctx, buf, n, seq_id) == n ? SWARM_OK : SWARM_ERR_STATE);
    if (rc != SWARM_OK) {
        clear_seq(s, seq_id);
    }
    return rc;
}

int swarm_dequantize_rows(int32_t type, const void * data, size_t row_bytes, int64_t n_rows,
                          int64_t n_per_row, const int32_t * ids, int32_t n_ids, float * out) {
    if (!data || !ids || !out || n_ids < 0 || n_rows < 1 || n_per_row < 1) {
        return SWARM_ERR_ARG;
    }
    if (type < 0 || type >= GGML_TYPE_COUNT) {
        return SWARM_ERR_TYPE;
    }
    const struct ggml_type_traits * tr = ggml_get_type_traits((enum ggml_type) type);
    if (tr->blck_size <= 0 || tr->type_size == 0 || (type != GGML_TYPE_F32 && !tr->to_float)) {
        return SWARM_ERR_TYPE;
    }
    if (n_per_row % tr->blck_size != 0 || ggml_row_size((enum ggml_type) type, n_per_row) != row_bytes) {
        return SWARM_ERR_ARG;
    }
    for (int32_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || ids[i] >= n_rows) {
            return SWARM_ERR_ARG;
        }
    }
    for (int32_t i = 0; i < n_ids; i++) {
        const char * row = (const char *) data + (size_t) ids[i] * row_bytes;
        float * dst = out + (size_t) i * (size_t) n_per_row;
        if (type == GGML_TYPE_F32) {
            memcpy(dst, row, row_bytes);
        } else {
            tr->to_float(row, dst, n_per_row);
        }
    }
    return SWARM_OK;
}

const char * swarm_status_str(int status) {
    switch (status) {
        case SWARM_OK:            return "ok";
        case SWARM_ERR_ARG:       return "bad argument";
        case SWARM_ERR_LOAD:      return "llama.cpp could not load the model file";
        case SWARM_ERR_CONTEXT:   return "llama.cpp could not create the context";
        case SWARM_ERR_SEQ:       return "sequence id out of range";
        case SWARM_ERR_POS:       return "position does not continue the sequence";
        case SWARM_ERR_KV_FULL:   return "KV cache full";
        case SWARM_ERR_DECODE:    return "llama_decode failed";
        case SWARM_ERR_CAPTURE:   return "boundary tensor not captured";
        case SWARM_ERR_BUF:       return "output buffer too small";
        case SWARM_ERR_STATE:     return "sequence state could not be read or written";
        case SWARM_ERR_TYPE:      return "ggml type has no dequantizer";
        case SWARM_ERR_NOT_EMPTY: return "sequence is not empty";
        case SWARM_ERR_INTERRUPTED: return "interrupted (swarm_span_interrupt)";
        case SWARM_ERR_NOT_HELD:  return "the MTP head no longer holds what it was fed at that position";
        default:                  return "unknown status";
    }
}

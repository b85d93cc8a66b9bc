// mtp_oracle.c: TEST-ONLY whole-model reference for a multi-token-prediction (MTP) draft head.
//
// llama-cpp-python does not expose llama.cpp's MTP contexts, so the parity tests
// (tests/parity/test_mtp_parity.py, through tests/helpers/mtp_oracle.py) get the whole model's MTP
// output from here. It loads the whole GGUF with its MTP block (load_mtp) and drives a target
// context and an MTP context (LLAMA_CONTEXT_TYPE_MTP) on it the way llama.cpp's
// common/speculative.cpp (`common_speculative_impl_draft_mtp`, one head, one draft token) does:
//   - after each target batch the MTP context decodes the same tokens at the same positions, the
//     token at p paired with h of p - 1 (h: the last layer's residual; the previous batch's last h
//     for the first row, zeros at p = 0);
//   - a draft decodes the next token at P + 1 with h of P, takes its logits and removes P + 1
//     again, so the MTP cache stays in step with the target.
// The target context runs with unmasked nextn output on (llama_set_embeddings_nextn(ctx, true,
// false)), as common/speculative.cpp sets it. One difference: h is copied from the graph through the
// scheduler's eval callback while the graph runs (the caller names the tensor: "h_nextn" for
// deepseek2, glm-dsa, qwen35, qwen35moe; "l_last-<n_layer - 1>" for deepseek4), instead of
// llama_get_embeddings_nextn. For deepseek4 the latter returns rows that match no row of the
// residual when a ubatch has more than one row (measured on the synthetic model: the first row of a
// 64-row prefill ubatch reads -0.07 where the residual holds 2.68, which a one-row run of the same
// token confirms; one-row ubatches agree exactly), so a prefill would feed the head garbage.
// Built by scripts/build_csrc.sh into tests/helpers/libswarm_mtp_oracle.so; the span library
// (swarm_span.c) does not use it.

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

// llama.cpp's staging API (src/llama-ext.h, C++ linkage): as in swarm_span.c
void oracle_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked)
    __asm__("_Z26llama_set_embeddings_nextnP13llama_contextbb");
float * oracle_get_embeddings_nextn_ith(struct llama_context * ctx, int32_t i)
    __asm__("_Z30llama_get_embeddings_nextn_ithP13llama_contexti");

struct oracle {
    struct llama_model   * model;
    struct llama_context * tgt;
    struct llama_context * mtp;
    int32_t n_vocab;
    int32_t n_h;        // width of h: llama_model_n_embd_out (hc x n_embd for deepseek4)
    int32_t n_pos;      // positions per token: 4 (M-RoPE sections) or 1
    char    name[64];   // the graph tensor h is captured from
    float * h;          // [n_ubatch, n_h] rows captured from the running target graph
    int64_t h_rows;
    int64_t h_cap;      // n_ubatch; a capture that would pass it is dropped (h_rows stays short)
    float * pending;    // [n_h] h of the last position the target ran
    float * rows;       // [n_ubatch, n_h] the MTP batch's h rows
};

static void quiet(enum ggml_log_level level, const char * text, void * ud) {
    (void) level; (void) text; (void) ud;
}

static bool capture(struct ggml_tensor * t, bool ask, void * ud) {
    struct oracle * o = ud;
    if (strcmp(t->name, o->name) != 0) {
        return !ask;
    }
    if (ask) {
        return true;
    }
    const int64_t rows = ggml_nelements(t) / o->n_h;
    if (t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && o->h_rows + rows <= o->h_cap) {
        ggml_backend_tensor_get(t, o->h + o->h_rows * o->n_h, 0, ggml_nbytes(t));
        o->h_rows += rows;
    }
    return true;
}

static int32_t argmax(const float * row, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
        if (row[i] > row[best]) {
            best = i;
        }
    }
    return best;
}

// One sequence, positions pos0.., token ids and optional h rows; logits of every row when want.
// M-RoPE models read n_pos positions per token, section-major; text uses the position in the first
// three sections and 0 in the fourth (as llama.cpp's batch allocator fills them).
static int decode(const struct oracle * o, struct llama_context * ctx, const int32_t * toks,
                  const float * embd, int32_t n, int32_t pos0, bool want) {
    llama_pos    pos[n * o->n_pos];
    int32_t      n_seq[n];
    llama_seq_id seq0 = 0;
    llama_seq_id * seq[n];
    int8_t       out[n];
    for (int32_t j = 0; j < o->n_pos; j++) {
        for (int32_t i = 0; i < n; i++) {
            pos[j * n + i] = j < 3 ? pos0 + i : 0;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        n_seq[i] = 1;
        seq[i] = &seq0;
        out[i] = want;
    }
    struct llama_batch b = {
        .n_tokens = n, .token = (llama_token *) toks, .embd = (float *) embd, .pos = pos,
        .n_seq_id = n_seq, .seq_id = seq, .logits = out,
    };
    return llama_decode(ctx, b) == 0 ? 0 : -4;
}

// Target rows toks[0..n) at pos0 (logits of every row into out, or none), then the MTP context on
// the same rows paired with h shifted by one position. Returns 0 or -4.
static int run_rows(struct oracle * o, const int32_t * toks, int32_t n, int32_t pos0, float * out) {
    o->h_rows = 0;
    if (decode(o, o->tgt, toks, NULL, n, pos0, out != NULL) != 0 || o->h_rows != n) {
        return -4;
    }
    for (int32_t i = 0; out && i < n; i++) {
        const float * lg = llama_get_logits_ith(o->tgt, i);
        if (!lg) {
            return -4;
        }
        memcpy(out + (size_t) i * o->n_vocab, lg, sizeof(float) * (size_t) o->n_vocab);
    }
    const size_t row = sizeof(float) * (size_t) o->n_h;
    memcpy(o->rows, o->pending, row);
    memcpy(o->rows + o->n_h, o->h, row * (size_t) (n - 1));
    memcpy(o->pending, o->h + (size_t) (n - 1) * o->n_h, row);
    return decode(o, o->mtp, toks, o->rows, n, pos0, false);
}

// MTP logits for tok at pos (h of pos - 1 is the pending row) into out[0], then n - 1 chained
// drafts as common/speculative.cpp's draft-mtp driver chains one head: out[i] for the greedy token
// of out[i - 1] at pos + i with the MTP context's own h_nextn of the row before. The drafted
// positions are removed again.
static int draft(struct oracle * o, int32_t tok, int32_t pos, int32_t n, float * out) {
    const float * h = o->pending;
    for (int32_t i = 0; i < n; i++) {
        if (decode(o, o->mtp, &tok, h, 1, pos + i, true) != 0) {
            return -4;
        }
        const float * lg = llama_get_logits_ith(o->mtp, 0);
        h = oracle_get_embeddings_nextn_ith(o->mtp, 0);
        if (!lg || !h) {
            return -4;
        }
        memcpy(out + (size_t) i * o->n_vocab, lg, sizeof(float) * (size_t) o->n_vocab);
        memcpy(o->rows, h, sizeof(float) * (size_t) o->n_h);  // h's buffer is the context's: copied
        h = o->rows;
        tok = argmax(lg, o->n_vocab);
    }
    return llama_memory_seq_rm(llama_get_memory(o->mtp), 0, pos, -1) ? 0 : -4;
}

static void release(struct oracle * o) {
    if (o->mtp) llama_free(o->mtp);
    if (o->tgt) llama_free(o->tgt);
    if (o->model) llama_model_free(o->model);
    free(o->h);
    free(o->pending);
    free(o->rows);
}

// Status: 0 ok; -1 bad argument (or vocab_cap != the model's n_vocab); -2 load; -3 context or
// memory; -4 decode; -5 the model has no MTP block.
//
// h_name: the target graph's tensor whose rows are the head's h ("h_nextn", or "l_last-<n - 1>" for
// deepseek4); "h_nextn" turns the target's unmasked nextn output on.
// Runs prompt[0..n_prompt) in llama_decode calls of n_ubatch tokens (one ubatch each), then
// n_decode greedy steps of one token, and after the prompt and after every step a chain of n_chain
// MTP drafts from the greedy next token. Threads: multi-row ubatches on n_threads, one-row ones on 1
// (the span executor's numeric contract); flash attention on; one sequence, 256 cells.
// Outputs (caller-allocated, float32 row-major, vocab_cap = n_vocab wide):
//   prefill_logits [n_prompt, n_vocab]     target logits of every prompt token
//   step_logits    [n_decode, n_vocab]     target logits after feeding tokens[i]
//   tokens         [n_decode]              greedy tokens (first maximum) fed in the steps
//   draft_logits   [n_decode + 1, n_chain, n_vocab] MTP logits: chain 0 from tokens[0] fed after
//                                          the prompt, chain i + 1 from the greedy token after step i
int swarm_mtp_oracle_run(const char * model_path, const char * h_name, const int32_t * prompt,
                         int32_t n_prompt, int32_t n_decode, int32_t n_ubatch, int32_t n_threads, int32_t vocab_cap,
                         int32_t n_chain, float * prefill_logits, float * step_logits, int32_t * tokens,
                         float * draft_logits) {
    if (!model_path || !h_name || strlen(h_name) >= 64 || !prompt || n_prompt < 1 || n_decode < 0 ||
        n_chain < 1 ||
        n_ubatch < 1 || n_threads < 1 || !prefill_logits || !step_logits || !tokens || !draft_logits) {
        return -1;
    }
    const char * want = getenv("SWARM_LLAMA_LOG");
    if (!want || !want[0]) {
        llama_log_set(quiet, NULL);
    }
    llama_backend_init();

    struct oracle o = { 0 };
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mtp = true;
    o.model = llama_model_load_from_file(model_path, mp);
    if (!o.model) {
        return -2;
    }
    int rc = 0;
    o.n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(o.model));
    o.n_h = llama_model_n_embd_out(o.model);
    if (llama_model_n_layer_nextn(o.model) < 1) {
        rc = -5;
    } else if (o.n_vocab != vocab_cap) {
        rc = -1;
    }
    snprintf(o.name, sizeof(o.name), "%s", h_name);
    const enum llama_rope_type rt = llama_model_rope_type(o.model);
    o.n_pos = rt == LLAMA_ROPE_TYPE_MROPE || rt == LLAMA_ROPE_TYPE_IMROPE ? 4 : 1;
    o.h_cap = n_ubatch;
    o.h = malloc(sizeof(float) * (size_t) n_ubatch * (size_t) o.n_h);
    o.rows = malloc(sizeof(float) * (size_t) n_ubatch * (size_t) o.n_h);
    o.pending = calloc((size_t) o.n_h, sizeof(float));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = (uint32_t) n_ubatch;
    cp.n_ubatch = (uint32_t) n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = n_threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.no_perf = true;
    cp.cb_eval = capture;
    cp.cb_eval_user_data = &o;
    if (rc == 0 && (!o.h || !o.rows || !o.pending || !(o.tgt = llama_init_from_model(o.model, cp)))) {
        rc = -3;
    }
    // deepseek4's graph names its last residual "h_nextn" when this is on, so l_last is read without
    if (rc == 0 && strcmp(o.name, "h_nextn") == 0) {
        oracle_set_embeddings_nextn(o.tgt, true, false);
    }
    cp.cb_eval = NULL;
    cp.cb_eval_user_data = NULL;
    cp.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    if (rc == 0 && !(o.mtp = llama_init_from_model(o.model, cp))) {
        rc = -3;
    }
    if (rc == 0) {
        oracle_set_embeddings_nextn(o.mtp, true, true);  // as the driver: h_nextn of output rows
    }

    for (int32_t off = 0; rc == 0 && off < n_prompt; off += n_ubatch) {
        const int32_t n = n_prompt - off < n_ubatch ? n_prompt - off : n_ubatch;
        rc = run_rows(&o, prompt + off, n, off, prefill_logits + (size_t) off * o.n_vocab);
    }
    int32_t pos = n_prompt;
    int32_t nxt = rc == 0 ? argmax(prefill_logits + (size_t) (n_prompt - 1) * o.n_vocab, o.n_vocab) : 0;
    if (rc == 0) {
        rc = draft(&o, nxt, pos, n_chain, draft_logits);
    }
    for (int32_t i = 0; i < n_decode && rc == 0; i++) {
        tokens[i] = nxt;
        float * row = step_logits + (size_t) i * o.n_vocab;
        rc = run_rows(&o, &nxt, 1, pos, row);
        pos++;
        nxt = argmax(row, o.n_vocab);
        if (rc == 0) {
            rc = draft(&o, nxt, pos, n_chain, draft_logits + (size_t) (i + 1) * n_chain * o.n_vocab);
        }
    }
    release(&o);
    return rc;
}

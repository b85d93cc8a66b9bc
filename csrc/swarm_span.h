// swarm_span.h: run layers [a, b) of a GGUF model on unmodified llama.cpp, hidden states in and out.
//
// The model file is a *span file* written by swarm.ggml_bridge.slicing: blocks a..b-1 renumbered
// from 0. Hidden states enter through llama_batch.embd; on a non-final span the residual after the
// span's last block (graph tensor "<capture_name>-<capture_layer>") is copied out in C from the
// scheduler eval callback; on the final span the output norm + head run and logits come back.
//
// Many sessions share one context: each is a llama.cpp sequence (seq_id in [0, n_seq_max)) with a
// KV stream of its own (llama.cpp's kv_unified = false): n_ctx cells split evenly, n_ctx_seq cells
// per sequence (swarm_span_n_ctx_seq). A sequence's cells start at cell 0 of its stream whatever
// the others hold, so its results do not depend on the other sequences; it can never hold more
// than n_ctx_seq positions (SWARM_ERR_KV_FULL).
//
// Status codes: every int-returning function returns SWARM_OK (0) or one negative code below;
// swarm_status_str() names it. No function aborts the process on bad input from the caller.
//
// Thread safety: a handle must be used by one thread at a time (the caller serialises calls);
// different handles may run concurrently on different threads. swarm_dequantize_rows and
// swarm_status_str are thread-safe, and swarm_span_interrupt may be called from any thread while
// the handle is open.
//
// Logging: llama.cpp/ggml log output is dropped unless the environment variable SWARM_LLAMA_LOG
// is set to a non-empty value when the first handle is opened.

#ifndef SWARM_SPAN_H
#define SWARM_SPAN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SWARM_OK              0
#define SWARM_ERR_ARG        -1   // null pointer, bad size, bad flag
#define SWARM_ERR_LOAD       -2   // llama.cpp could not load the model file
#define SWARM_ERR_CONTEXT    -3   // llama.cpp could not create the context (memory?)
#define SWARM_ERR_SEQ        -4   // seq_id outside [0, n_seq_max)
#define SWARM_ERR_POS        -5   // pos0 != (last position of the sequence) + 1, or pos < 0
#define SWARM_ERR_KV_FULL    -6   // no free KV cells for the batch; the sequence is left as before
#define SWARM_ERR_DECODE     -7   // llama_decode failed; the sequence is left as before
#define SWARM_ERR_CAPTURE    -8   // the boundary tensor was not produced with the expected shape
#define SWARM_ERR_BUF        -9   // caller buffer too small
#define SWARM_ERR_STATE     -10   // sequence state could not be read / written (bad bytes?)
#define SWARM_ERR_TYPE      -11   // ggml type unknown or has no dequantizer
#define SWARM_ERR_NOT_EMPTY -12   // state import into a sequence that already holds tokens
#define SWARM_ERR_INTERRUPTED -13 // swarm_span_interrupt stopped the step; the sequence is left as before
#define SWARM_ERR_NOT_HELD  -14   // the MTP head no longer holds what it was fed at that position

struct swarm_span;   // opaque handle: created by swarm_span_open, released by swarm_span_close

struct swarm_span_params {
    const char * model_path;     // span GGUF; read (mmap) during open only, copied by llama.cpp
    uint32_t     n_ctx;          // KV cells in all; each sequence gets n_ctx / n_seq_max of them (llama.cpp
                                 // rounds; swarm_span_n_ctx / swarm_span_n_ctx_seq give the result)
    uint32_t     n_seq_max;      // sequences (sessions), 1..256
    int32_t      n_threads;      // CPU threads for multi-row ubatches (prefill, batches), >= 1;
                                 // one-row ubatches always run on 1 thread (numeric contract)
    uint32_t     n_batch;        // max tokens per llama_decode call; longer steps are split
    uint32_t     n_ubatch;       // physical batch, <= n_batch
    int32_t      flash_attn;     // 0 off (llama-cpp-python's default), 1 on, -1 llama.cpp auto
    const char * capture_name;   // e.g. "l_out"; ignored when is_last (unless mtp is 1); copied during open
    int32_t      capture_layer;  // block index inside the span file, normally n_layers - 1
    int32_t      is_last;        // 1: return logits (needs a vocabulary), 0: return hidden states
    int32_t      require_token_ids; // 1: every step must carry token_ids (layers of the span read them,
                                 // e.g. deepseek4's hash-routed MoE layers); 0: token_ids are ignored
    int32_t      mtp;            // also run the file's multi-token-prediction head (last span only;
                                 // the file must hold exactly one MTP block: llama.cpp's
                                 // nextn_predict_layers = 1); every step must then carry token_ids.
                                 // The head's h input, captured for every row of a step:
                                 // 1: the last block's residual, named by capture_name/capture_layer
                                 //    (deepseek4's hyper-connection state l_last);
                                 // 2: llama.cpp's "h_nextn", the output-normed residual (deepseek2,
                                 //    glm-dsa, qwen35, qwen35moe), with the context's unmasked nextn
                                 //    output on so the last block runs every row (capture_* ignored).
                                 // 0: no head
    int32_t      mtp_truncate;   // with mtp: 1 the span's cache truncates exactly (not recurrent or
                                 // compressed): the head remembers what it was fed at each sequence's
                                 // last SWARM_MTP_TRUNCATE_ROWS positions, and swarm_span_truncate cuts
                                 // both caches back that far; 0: it remembers SWARM_MTP_MAX_DRAFTS
                                 // positions (for drafts only) and refuses truncation into a sequence
};

// One forward step of one sequence.
struct swarm_span_step {
    int32_t       seq_id;      // in [0, n_seq_max)
    int32_t       pos0;        // position of the first token: must be pos_max(seq_id) + 1 (0 if empty)
    int32_t       n_tokens;    // >= 1
    const float * embd;        // [n_tokens, n_embd] f32 row-major, caller-owned, read only
    float       * out;         // caller-allocated, see out_cap
    size_t        out_cap;     // capacity of out in floats; needed:
                               //   non-last: n_tokens * n_embd  -> hidden [n_tokens, n_embd]
                               //   last, all_logits = 0: n_vocab -> logits of the last token [1, n_vocab]
                               //   last, all_logits = 1: n_tokens * n_vocab -> [n_tokens, n_vocab]
    int32_t       all_logits;  // last span only: 1 = logits for every token
    const int32_t * token_ids; // [n_tokens] token id of each row, or NULL; required when the span was
                               // opened with require_token_ids, ignored otherwise
};

// The MTP head (swarm_span_params.mtp): a second llama.cpp context on the same model
// (LLAMA_CONTEXT_TYPE_MTP) with a KV stream per sequence of its own, kept in step with the span's:
// every step also feeds the head its rows, the token at position p paired with h of p - 1 (h: the
// last block's residual of p, captured like a non-last span's boundary; the previous step's last h
// for a step's first row, zeros at p = 0), as llama.cpp's common/speculative.cpp feeds its MTP
// context. swarm_span_mtp_draft then decodes the next token at pos_max + 1 (and chained drafts after
// it) and removes them again.
// Both caches hold the same positions after every call; truncate cuts both as far back as the head
// remembers its fed rows (mtp_truncate) or refuses, clear and state export/import cover both (and
// the last position's h).

// Load the span file and create its context. On success *out owns the handle (free it with
// swarm_span_close); on failure *out is NULL. Errors: ARG, LOAD, CONTEXT.
int swarm_span_open(const struct swarm_span_params * p, struct swarm_span ** out);

// Release the handle, its context and model. NULL is allowed.
void swarm_span_close(struct swarm_span * s);

int32_t swarm_span_n_embd (const struct swarm_span * s);  // width of a hidden-state row in and out:
                                                          // llama_model_n_embd_inp (n_embd, or hc x n_embd
                                                          // for a deepseek4 span file)
int32_t swarm_span_n_vocab(const struct swarm_span * s);  // 1 for a non-final span
int32_t swarm_span_n_ctx  (const struct swarm_span * s);  // KV cells in all, after llama.cpp's rounding
int32_t swarm_span_n_ctx_seq(const struct swarm_span * s); // KV cells of one sequence's stream: the most
                                                           // positions one sequence can hold

// Run one step. Atomic per sequence: on any error the sequence's KV is as before the call, or empty
// where llama.cpp cannot drop the step's positions again (deepseek4's compressed cache after a step
// that failed past its first n_batch chunk): never half-advanced.
// Steps longer than n_batch are decoded in n_batch chunks. Errors: ARG, SEQ, POS, KV_FULL,
// DECODE, CAPTURE, BUF, INTERRUPTED.
int swarm_span_execute(struct swarm_span * s, const struct swarm_span_step * step);

// Ask swarm_span_execute to stop (on = 1) or let it run (on = 0). While on, a running or later
// swarm_span_execute stops at its next graph node (ggml-cpu checks after each node) and returns
// SWARM_ERR_INTERRUPTED with its sequence as before the call; the request stays until cleared, so a
// caller that interrupts the step running now clears it before the next one. Only
// swarm_span_execute is stopped: batches, the MTP head and every other call ignore it. A step that
// is stopped computes nothing that a rerun would not compute again identically, on a cache whose
// positions can be dropped (not deepseek4's compressed one, where the sequence ends empty).
void swarm_span_interrupt(struct swarm_span * s, int32_t on);

// Run one step for each of n_steps different sequences together, so the weights are read once per
// ubatch for all of them. steps[k] is read as for swarm_span_execute and its out gets the same rows
// it would get there. Needs 1 <= n_steps <= n_seq_max, distinct seq_ids and sum of n_tokens <=
// n_batch (the caller splits longer work). The steps are ordered by seq_id and each run of
// consecutive seq_ids with equal n_tokens (at most n_ubatch rows) is one llama_decode call and one
// ubatch: llama.cpp batches only consecutive KV streams together, so a batch of seq ids {0, 1, 2, 5}
// costs two ubatches. Atomic for the whole batch: on any error every step's sequence is as before
// the call (or empty, as for swarm_span_execute). Results per sequence equal a solo step only where
// llama.cpp's kernels do not depend on the ubatch's row count (see
// tests/parity/test_executor_sessions.py). Errors: ARG (also duplicate seq_id, too many tokens),
// SEQ, POS, KV_FULL, DECODE, CAPTURE, BUF.
int swarm_span_execute_batch(struct swarm_span * s, const struct swarm_span_step * steps, int32_t n_steps);

// The most drafts one call chains (swarm_span_mtp_draft's n_draft).
#define SWARM_MTP_MAX_DRAFTS 8
// How far back swarm_span_truncate cuts a sequence of a head opened with mtp_truncate: two verify
// passes of the wire's most rows (a pass and one sent ahead of its answer roll back together).
#define SWARM_MTP_TRUNCATE_ROWS 128

// MTP drafts for `token` at position pos_max(seq_id) + 1: out[0] ([n_vocab] of out's [n_draft,
// n_vocab]) is the logits the head gives for the token after it; out[i] those for the token after
// the greedy token (first maximum) of out[i - 1], which the head decodes at the next position with
// its own h_nextn of the row before, as llama.cpp's common/speculative.cpp chains one MTP head
// (n_draft = 1: one draft). *n_made: the rows of out written (>= 1 on SWARM_OK; a chain that runs
// out of KV cells after its first draft ends there). The sequence is unchanged afterwards (the
// head's KV entries for the drafted positions are removed again). Needs a handle opened with
// mtp != 0, 1 <= n_draft <= SWARM_MTP_MAX_DRAFTS, a sequence holding at least one position and a
// free KV cell past it. Errors: ARG (no head, bad token or n_draft, NULL out or n_made), SEQ, POS
// (empty sequence), BUF (out_cap < n_draft * n_vocab), KV_FULL, DECODE, STATE (the head's cache
// is not in step with the span's).
int swarm_span_mtp_draft(struct swarm_span * s, int32_t seq_id, int32_t token, int32_t n_draft, float * out,
                         size_t out_cap, int32_t * n_made);

// MTP drafts as swarm_span_mtp_draft for `token` at position `pos` <= pos_max(seq_id) + 1, as if the
// sequence ended at pos - 1: the head decodes `token` with the h it was fed at pos (h of pos - 1),
// then its rows at pos..pos_max are fed again as they were, so both caches hold the same positions
// afterwards (the re-fed rows' entries may round apart from the first ones: they are for a verify
// pass's rejected rows, which the caller rolls back). pos = pos_max + 1 is swarm_span_mtp_draft.
// The head remembers what it was fed at the last SWARM_MTP_MAX_DRAFTS positions (MTP_RING) since
// the sequence was emptied or imported, at most n_batch back. Errors: as swarm_span_mtp_draft; POS
// (pos < 1 or past pos_max + 1); NOT_HELD (pos_max - pos + 1 rows not remembered); DECODE
// (re-feeding failed: the sequence is emptied in both caches).
int swarm_span_mtp_draft_at(struct swarm_span * s, int32_t seq_id, int32_t token, int32_t pos,
                            int32_t n_draft, float * out, size_t out_cap, int32_t * n_made);

// Drop positions >= pos of seq_id (pos >= 0), in the span's cache and the head's. With an MTP head
// opened without mtp_truncate only pos = 0 (clear) or pos > pos_max (nothing to drop) are accepted,
// else STATE; with it, also a pos whose fed row the head remembers (at most SWARM_MTP_TRUNCATE_ROWS
// back, not before a state import), else NOT_HELD: the head's pending h becomes the h it was fed at
// pos (h of pos - 1), so the next step continues as if the dropped rows had never been fed.
// Errors: ARG, SEQ, STATE, NOT_HELD.
int swarm_span_truncate(struct swarm_span * s, int32_t seq_id, int32_t pos);

// Drop every position of seq_id. Errors: ARG, SEQ.
int swarm_span_clear(struct swarm_span * s, int32_t seq_id);

// Largest position held by seq_id, or -1 when empty; SWARM_ERR_SEQ / SWARM_ERR_ARG (< -1) on error.
int32_t swarm_span_seq_pos_max(struct swarm_span * s, int32_t seq_id);

// Bytes needed to export seq_id's state (0 on a bad handle or seq_id). With an MTP head the bytes
// are a frame ("SWMTP001", u64 span bytes, u64 head bytes, both llama.cpp states, then the last
// h row: n_embd float32) that only an MTP handle on the same span file imports.
size_t swarm_span_state_size(struct swarm_span * s, int32_t seq_id);

// Copy seq_id's KV state into buf (caller-owned, cap bytes); *written gets the byte count.
// Errors: ARG, SEQ, BUF (cap < swarm_span_state_size), STATE.
int swarm_span_state_get(struct swarm_span * s, int32_t seq_id, uint8_t * buf, size_t cap, size_t * written);

// Load state bytes (from swarm_span_state_get of a handle on the same span file) into an empty
// seq_id. Bad bytes are refused and leave the sequence empty. Errors: ARG, SEQ, NOT_EMPTY, STATE.
int swarm_span_state_set(struct swarm_span * s, int32_t seq_id, const uint8_t * buf, size_t n);

// Dequantize rows ids[0..n_ids) of a [n_rows, n_per_row] matrix of ggml_type `type` stored at data
// (row_bytes per row, as in a GGUF) into out [n_ids, n_per_row] f32 (caller-allocated), with ggml's
// own to_float -- the routine llama.cpp's CPU get_rows uses, so rows match bit for bit.
// Errors: ARG (bad ids, sizes), TYPE.
int swarm_dequantize_rows(int32_t type, const void * data, size_t row_bytes, int64_t n_rows,
                          int64_t n_per_row, const int32_t * ids, int32_t n_ids, float * out);

// Static string naming a status code ("ok", "bad argument", ...). Never NULL.
const char * swarm_status_str(int status);

#ifdef __cplusplus
}
#endif

#endif // SWARM_SPAN_H

#pragma once
// Evaluating a trained language model (`ham eval`; `ham compare` builds on it):
//   * perplexity on held-out data (text's held-out documents or token shards);
//   * MQAR (Zoology): per-query accuracy of the argmax at the query positions, and the
//     fraction of sequences with every query right;
//   * RULER needle in a haystack: greedy generation, scored by RULER's string-match-all;
//   * multiple choice as lm-evaluation-harness scores it: each choice by the summed
//     log-likelihood of its tokens given the context (acc), and by that sum divided by the
//     choice's length in characters (acc_norm).
// For models that route tokens (HAM) every task also reports the KV fraction per layer,
// averaged over the sequences it ran.
//
// Generation goes through a Completer, so this file does not depend on any decoder: the
// full-forward one below is the slow, exact reference; a KV-cached decoder plugs in the same.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "train/synthetic.h"
#include "train/text_data.h"

namespace ham {

class Tokenizer;

// Greedy continuation of `prompt`: at most max_new_tokens new ids (the prompt not included),
// ending early at the completer's own stop tokens (not included either).
using Completer = std::function<std::vector<int64_t>(const std::vector<int64_t>& prompt,
                                                     int64_t max_new_tokens)>;

// The reference completer: for every new token, the full forward pass over the prompt and
// the tokens so far, then the argmax of the last position (the lowest id on ties). `model`
// must outlive the completer.
Completer full_forward_completer(const LanguageModel& model, std::vector<int64_t> stop_tokens);

// Where a generated answer ends: the tokenizer's end-of-text token, every token whose text
// holds a newline, and every id in [tokenizer vocabulary, model_vocab_size) (the tokenizer
// cannot decode them).
std::vector<int64_t> answer_stop_tokens(const Tokenizer& tokenizer, int64_t model_vocab_size);

// HAM: sets every layer's routing threshold tau (score units; a KV-cached decoder built
// afterwards uses it too). An error naming the family for models that do not route.
void set_routing_threshold(LanguageModel& model, double tau);

// ---- results ------------------------------------------------------------------------------
// kv_fraction: per layer, selected tokens / tokens, averaged over the task's sequences;
// empty for families without routing.

struct PerplexityResult {
  std::string data;  // what was read
  int64_t seq_len = 0;
  int64_t sequences = 0;
  int64_t tokens = 0;      // predicted tokens
  double mean_loss = 0;    // nats per token
  double perplexity = 0;   // exp(mean_loss)
  std::vector<double> kv_fraction;
  // With a tokenizer: the bytes of text the predicted tokens stand for, and the loss in
  // bits per byte, sum(-log2 p) / bytes, which compares across tokenizers. 0 without one.
  int64_t bytes = 0;
  double bits_per_byte = 0;
};

struct MqarResult {
  int64_t seq_len = 0;
  int64_t num_pairs = 0;
  int64_t samples = 0;
  int64_t queries = 0;
  double accuracy = 0;           // correct queries / queries
  double sequence_accuracy = 0;  // sequences with every query correct / sequences
  std::vector<double> kv_fraction;
};

struct NiahSample {
  std::vector<std::string> expected;
  std::string output;  // the decoded generation, cut at its first newline
  double score = 0;    // ruler_score(output, expected)
};

struct NiahResult {
  std::string task;            // "single_1", ...
  int64_t context_tokens = 0;  // prompt length the haystack fills up to
  int64_t samples = 0;
  double accuracy = 0;         // mean ruler_score
  std::vector<double> kv_fraction;  // of the prompts' forward passes
  std::vector<NiahSample> examples;  // the first few, to see what the model wrote
};

struct ChoiceResult {
  std::string name;  // the file
  int64_t examples = 0;
  double acc = 0;
  double acc_norm = 0;
  std::vector<double> kv_fraction;
};

// ---- tasks --------------------------------------------------------------------------------

// Mean next-token loss over consecutive windows of seq_len + 1 tokens of `data`, batch_size
// windows per forward, at most max_batches batches (0: all). Every target counts once, so
// mean_loss is the per-token mean even when the last batch is short. With `tokenizer` (the
// data's), the targets' text bytes give bits per byte; an id outside its vocabulary is an
// error naming it.
PerplexityResult evaluate_perplexity(const LanguageModel& model, const TokenSource& data,
                                     int64_t batch_size, int64_t seq_len, int64_t max_batches,
                                     std::string description = "", const Tokenizer* tokenizer = nullptr);

// Examples 0 .. samples - 1 of `config`'s dataset (config.seed), batch_size per forward.
MqarResult evaluate_mqar(const LanguageModel& model, const MqarConfig& config, int64_t samples,
                         int64_t batch_size);

struct NiahRun {
  NiahKind kind = NiahKind::Single1;
  int64_t context_tokens = 256;
  int64_t samples = 10;
  uint64_t seed = 1;  // sample i uses RULER's preset for `kind` with seed + i
  // New tokens allowed beyond the expected answer " v1, v2." (RULER generates a fixed
  // budget; string-match-all ignores what follows the answer).
  int64_t margin_tokens = 8;
  int64_t examples_kept = 3;  // NiahResult::examples
};

// The prompt (sized with the tokenizer's token count, no document-start token, as the
// training mixture's NIAH rows) goes to `complete`; the decoded output, cut at its first
// newline, is scored with ruler_score. The KV fraction comes from one forward pass over
// each prompt (only for models that route).
NiahResult evaluate_niah(const LanguageModel& model, const Tokenizer& tokenizer,
                         const Completer& complete, const NiahRun& run);

// One line of a multiple-choice JSONL file: {"context": str, "choices": [str, ...],
// "answer": int}. Other keys are ignored (ids, task names).
struct ChoiceExample {
  std::string context;
  std::vector<std::string> choices;  // appended to the context as written (include any space)
  int64_t answer = 0;
  std::string where;  // "FILE:LINE", for messages
};

// Blank lines are skipped; a bad line is a one-line error "FILE:LINE: key 'K' ...".
std::vector<ChoiceExample> load_choice_file(const std::string& path);

// The token ids lm-evaluation-harness would score for (context, continuation): white space
// at the end of the context moves to the front of the continuation, the continuation's ids
// are encode(context + continuation) past the first |encode(context)| ids, and the context
// is preceded by the document-start token (so an empty context still has one).
struct ContinuationTokens {
  std::vector<int64_t> context;
  std::vector<int64_t> continuation;
};
ContinuationTokens continuation_tokens(const Tokenizer& tokenizer, const std::string& context,
                                       const std::string& continuation);

// sum_j log p(continuation_j | context, continuation_<j) in one forward pass of one sequence.
double continuation_log_likelihood(const LanguageModel& model, const ContinuationTokens& tokens);

// acc: the choice with the highest log-likelihood is the answer; acc_norm: the same with
// each log-likelihood divided by the choice's length in UTF-8 characters (the harness's
// len(str)). Ties go to the first choice. Each (context, choice) is its own forward pass.
ChoiceResult evaluate_multiple_choice(const LanguageModel& model, const Tokenizer& tokenizer,
                                      const std::vector<ChoiceExample>& examples,
                                      std::string name);

// ---- everything at once -------------------------------------------------------------------

struct EvalOptions {
  bool perplexity = true;
  // As `ham train --data`: text ("" = the embedded corpus) is measured on its held-out last
  // 5% of documents (the ones training validated on); token shards are measured whole.
  std::string data_path;
  std::string tokenizer = "bytes";  // shards' document-start id; NIAH and choices' encoder
  int64_t seq_len = 128;            // perplexity windows
  int64_t batch_size = 8;           // perplexity and MQAR sequences per forward
  int64_t max_batches = 0;          // perplexity batches (0: all of the data)
  std::vector<int64_t> mqar_lengths;
  int64_t mqar_pairs = 8;
  std::vector<std::string> niah_tasks;  // names niah_kind_from_name accepts
  std::vector<int64_t> niah_lengths;
  int64_t samples = 20;             // per MQAR length and per NIAH task and length
  int64_t niah_margin_tokens = 8;
  std::vector<std::string> choice_files;
  // Training mixtures draw MQAR from seed 0's dataset; evaluating another seed keeps the
  // examples held out. NIAH sample i uses seed + i.
  uint64_t seed = 1;

  void validate() const;  // one-line errors naming the option
  nlohmann::json to_json() const;
  // Overrides the keys present in `j` (the keys of to_json()); an unknown key or a value of
  // the wrong type is a one-line error naming `source` and the key.
  void update_from_json(const nlohmann::json& j, const std::string& source);
};

// One headline number of an EvalReport.
struct EvalMetric {
  std::string name;  // "perplexity (T=128)", "MQAR T=64 acc", "NIAH single_1 T=512", ...
  double value = 0;
};

struct EvalReport {
  std::string family;
  std::string source;  // where the weights came from
  int64_t step = -1;   // checkpoint step; -1 for an export or an untrained model
  int64_t parameters = 0;
  std::vector<double> tau;  // HAM: each layer's routing threshold during the evaluation
  std::string generation;   // how NIAH answers were generated (set by the caller)
  nlohmann::json options;
  std::optional<PerplexityResult> perplexity;
  std::vector<MqarResult> mqar;
  std::vector<NiahResult> niah;
  std::vector<ChoiceResult> choices;

  nlohmann::json to_json() const;
  // The cells of one row per task, in the order evaluate_model runs them: task, length,
  // samples, metrics, KV fraction (mean [per layer]).
  std::vector<std::vector<std::string>> rows() const;
  // The rows aligned under a header line naming the model.
  std::string table() const;
  // The headline numbers, in the order of rows(): perplexity, each MQAR length's accuracy
  // and all-correct rate, each NIAH task and length's accuracy, each choice file's acc and
  // acc_norm. Reports made with the same options give the same names.
  std::vector<EvalMetric> metrics() const;
  // HAM: the selected-token fraction, mean over the tasks of each task's mean over
  // layers; NaN for families that do not route.
  double mean_kv_fraction() const;
};

// Runs every task the options ask for. `complete` is needed only for NIAH tasks. With
// `progress`, each task's row goes there as soon as it is done, with its wall time.
EvalReport evaluate_model(const LanguageModel& model, const EvalOptions& options,
                          const Completer& complete, std::ostream* progress = nullptr);

}  // namespace ham

#include "train/evaluation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "autograd/grad_mode.h"
#include "models/ham.h"
#include "train/tokenizer.h"
#include "train/trainer.h"
#include "train/training_data.h"

namespace ham {

namespace {

// The model's forward with the batch moved to where its parameters are: a model trained on
// a GPU is evaluated there.
Tensor forward_where_the_model_is(const LanguageModel& model, const TokenBatch& batch) {
  return model.forward(batch_on_device(batch, model_device(model)));
}

// One sequence as a [1, T] batch: one document, positions 0 .. T - 1.
TokenBatch single_sequence(const std::vector<int64_t>& tokens) {
  const int64_t T = int64_t(tokens.size());
  return {Tensor::from_vector(tokens, {1, T}), Tensor(), Tensor::zeros({1, T}, DType::I64),
          Tensor::arange(T).reshape({1, T})};
}

// The lowest id with the largest value among values[0 .. n).
template <class T>
int64_t argmax(const T* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

// log softmax(row)[target], in double.
double log_probability(const float* row, int64_t vocab, int64_t target) {
  double max = row[argmax(row, vocab)];
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - max);
  return double(row[target]) - max - std::log(sum);
}

// The per-layer KV fraction of every forward pass, averaged with each pass weighted by its
// number of sequences (HAM's routing() is already the mean over a pass's sequences).
class KvFractionMean {
 public:
  void add(const LanguageModel& model, int64_t sequences) {
    std::vector<LayerRouting> routing = model.routing();
    if (routing.empty()) return;
    if (sum_.empty()) sum_.assign(routing.size(), 0.0);
    for (size_t i = 0; i < routing.size(); ++i) {
      sum_[i] += routing[i].kv_fraction * double(sequences);
    }
    sequences_ += sequences;
  }
  std::vector<double> mean() const {
    std::vector<double> out = sum_;
    for (double& v : out) v /= double(sequences_);
    return out;
  }

 private:
  std::vector<double> sum_;
  int64_t sequences_ = 0;
};

bool model_routes(const LanguageModel& model) { return !model.routing().empty(); }

// Characters of UTF-8 text: bytes that do not continue a multi-byte character.
int64_t utf8_length(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

// "0.482 [0.510 0.455]": the mean over layers, then each layer.
std::string kv_fraction_cell(const std::vector<double>& per_layer) {
  if (per_layer.empty()) return "-";
  double mean = 0;
  for (double f : per_layer) mean += f / double(per_layer.size());
  std::string out = fmt::format("{:.3f} [", mean);
  for (size_t i = 0; i < per_layer.size(); ++i) {
    out += fmt::format("{}{:.3f}", i ? " " : "", per_layer[i]);
  }
  return out + "]";
}

}  // namespace

Completer full_forward_completer(const LanguageModel& model, std::vector<int64_t> stop_tokens) {
  return [&model, stop_tokens = std::move(stop_tokens)](const std::vector<int64_t>& prompt,
                                                        int64_t max_new_tokens) {
    HAM_CHECK(!prompt.empty(), "full_forward_completer: the prompt is empty");
    HAM_CHECK(max_new_tokens >= 0, "full_forward_completer: max_new_tokens must be >= 0, got ",
              max_new_tokens);
    NoGradGuard no_grad;
    std::vector<int64_t> sequence = prompt, generated;
    for (int64_t i = 0; i < max_new_tokens; ++i) {
      Tensor logits = forward_where_the_model_is(model, single_sequence(sequence));  // [1, T, V]
      const int64_t vocab = logits.size(-1);
      const int64_t last_position = int64_t(sequence.size()) - 1;
      std::vector<float> last = logits.select(0).select(last_position).to_vector<float>();
      int64_t next = argmax(last.data(), vocab);
      if (std::find(stop_tokens.begin(), stop_tokens.end(), next) != stop_tokens.end()) break;
      generated.push_back(next);
      sequence.push_back(next);
    }
    return generated;
  };
}

std::vector<int64_t> answer_stop_tokens(const Tokenizer& tokenizer, int64_t model_vocab_size) {
  std::vector<int64_t> stops;
  if (tokenizer.eot_id() >= 0) stops.push_back(tokenizer.eot_id());
  for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (id != tokenizer.eot_id() && tokenizer.decode({id}).find('\n') != std::string::npos) {
      stops.push_back(id);
    }
  }
  for (int64_t id = tokenizer.vocab_size(); id < model_vocab_size; ++id) stops.push_back(id);
  return stops;
}

void set_routing_threshold(LanguageModel& model, double tau) {
  auto* ham = dynamic_cast<HAMModel*>(&model);
  HAM_CHECK(ham != nullptr, "--tau: the model is a ", family_name(model.config().family),
            " model; only HAM routes tokens by a threshold");
  for (const auto& layer : ham->layers) {
    const double scale = layer->mixer->threshold.scale();
    HAM_CHECK(tau > 0 && tau < scale, "--tau ", tau, ": the threshold must lie in (0, ", scale,
              "), the range of this model's routing scores");
    layer->mixer->threshold.set_tau(tau);
  }
}

// ---- perplexity ---------------------------------------------------------------------------

PerplexityResult evaluate_perplexity(const LanguageModel& model, const TokenSource& data,
                                     int64_t batch_size, int64_t seq_len, int64_t max_batches,
                                     std::string description, const Tokenizer* tokenizer) {
  HAM_CHECK(batch_size >= 1 && seq_len >= 1 && max_batches >= 0, "evaluate_perplexity: "
            "batch_size and seq_len must be >= 1 and max_batches >= 0, got ", batch_size, ", ",
            seq_len, " and ", max_batches);
  HAM_CHECK(data.size() >= seq_len + 1, "evaluate_perplexity: ",
            description.empty() ? std::string("the data") : description, " holds ", data.size(),
            " tokens, fewer than one window of seq_len + 1 = ", seq_len + 1);
  NoGradGuard no_grad;
  PerplexityResult result;
  result.data = std::move(description);
  result.seq_len = seq_len;
  KvFractionMean kv;
  double loss_sum = 0;  // sum over targets of -log p
  int64_t batches = 0;
  std::vector<int64_t> starts;
  auto run_batch = [&] {
    TokenBatch batch = data.batch_at(starts, seq_len);
    std::vector<int64_t> targets = batch.targets.to_vector<int64_t>();
    int64_t counted = 0;
    for (int64_t t : targets) {
      if (t == kSyntheticIgnoreIndex) continue;
      ++counted;
      if (!tokenizer) continue;
      HAM_CHECK(t >= 0 && t < tokenizer->vocab_size(), "evaluate_perplexity: ",
                result.data.empty() ? std::string("the data") : result.data, " holds token id ", t,
                ", outside the tokenizer's vocabulary (", tokenizer->name(), ", ", tokenizer->vocab_size(),
                " ids): give the data's tokenizer (--tokenizer)");
      result.bytes += tokenizer->text_bytes(t);
    }
    if (counted > 0) loss_sum += model.loss(batch).item() * double(counted);  // loss is the mean
    kv.add(model, int64_t(starts.size()));
    result.tokens += counted;
    result.sequences += int64_t(starts.size());
    ++batches;
    starts.clear();
  };
  for (int64_t s = 0; s + seq_len + 1 <= data.size(); s += seq_len) {
    starts.push_back(s);
    if (int64_t(starts.size()) == batch_size) {
      run_batch();
      if (batches == max_batches) break;
    }
  }
  if (!starts.empty()) run_batch();
  HAM_CHECK(result.tokens > 0, "evaluate_perplexity: no target takes part in the loss");
  result.mean_loss = loss_sum / double(result.tokens);
  result.perplexity = std::exp(result.mean_loss);
  if (result.bytes > 0) result.bits_per_byte = loss_sum / (std::log(2.0) * double(result.bytes));
  result.kv_fraction = kv.mean();
  return result;
}

// ---- MQAR ---------------------------------------------------------------------------------

MqarResult evaluate_mqar(const LanguageModel& model, const MqarConfig& config, int64_t samples,
                         int64_t batch_size) {
  config.validate();
  HAM_CHECK(samples >= 1 && batch_size >= 1, "evaluate_mqar: samples and batch_size must be "
            ">= 1, got ", samples, " and ", batch_size);
  HAM_CHECK(config.vocab_size <= model.config().vocab_size, "evaluate_mqar: MQAR vocab_size ",
            config.vocab_size, " exceeds the model's vocab_size ", model.config().vocab_size);
  NoGradGuard no_grad;
  MqarResult result;
  result.seq_len = config.seq_len;
  result.num_pairs = config.num_pairs;
  result.samples = samples;
  KvFractionMean kv;
  int64_t correct = 0, sequences_correct = 0;
  const int64_t T = config.seq_len;
  for (int64_t first = 0; first < samples; first += batch_size) {
    const int64_t rows = std::min(batch_size, samples - first);
    TokenBatch batch = mqar_batch(config, first, rows);
    Tensor logits = forward_where_the_model_is(model, batch);  // [rows, T, V]
    kv.add(model, rows);
    const int64_t vocab = logits.size(-1);
    std::vector<float> values = logits.to_vector<float>();
    std::vector<int64_t> targets = batch.targets.to_vector<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
      bool all_right = true;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t target = targets[size_t(r * T + t)];
        if (target == kSyntheticIgnoreIndex) continue;  // only query positions carry targets
        bool right = argmax(values.data() + (r * T + t) * vocab, vocab) == target;
        correct += right;
        all_right = all_right && right;
        ++result.queries;
      }
      sequences_correct += all_right;
    }
  }
  result.accuracy = double(correct) / double(result.queries);
  result.sequence_accuracy = double(sequences_correct) / double(samples);
  result.kv_fraction = kv.mean();
  return result;
}

// ---- NIAH ---------------------------------------------------------------------------------

NiahResult evaluate_niah(const LanguageModel& model, const Tokenizer& tokenizer,
                         const Completer& complete, const NiahRun& run) {
  HAM_CHECK(bool(complete), "evaluate_niah: no completer given");
  HAM_CHECK(run.samples >= 1 && run.margin_tokens >= 0 && run.examples_kept >= 0,
            "evaluate_niah: samples must be >= 1 and margin_tokens, examples_kept >= 0, got ",
            run.samples, ", ", run.margin_tokens, ", ", run.examples_kept);
  TokenCounter counter = [&tokenizer](std::string_view text) {
    return int64_t(tokenizer.encode(text).size());
  };
  NiahResult result;
  result.task = std::string(niah_kind_name(run.kind));
  result.context_tokens = run.context_tokens;
  result.samples = run.samples;
  const bool routes = model_routes(model);
  KvFractionMean kv;
  double score_sum = 0;
  for (int64_t i = 0; i < run.samples; ++i) {
    NiahConfig config = NiahConfig::preset(run.kind, run.context_tokens, run.seed + uint64_t(i));
    NiahExample example;
    try {
      example = make_niah_example(config, counter);
    } catch (const Error& e) {
      HAM_FAIL("NIAH ", result.task, " at ", run.context_tokens, " tokens: ", e.what());
    }
    std::vector<int64_t> prompt = tokenizer.encode(example.prompt);
    // The answer as the training mixture writes it: " v1, v2.".
    const int64_t answer_tokens =
        int64_t(tokenizer.encode(" " + join(example.expected, ", ") + ".").size());
    std::vector<int64_t> generated = complete(prompt, answer_tokens + run.margin_tokens);
    // Ids the tokenizer cannot decode end the answer, like a stop token.
    auto decodable = std::find_if(generated.begin(), generated.end(), [&](int64_t id) {
      return id < 0 || id >= tokenizer.vocab_size();
    });
    std::string output = tokenizer.decode(std::vector<int64_t>(generated.begin(), decodable));
    output = output.substr(0, output.find('\n'));
    double score = ruler_score(output, example.expected);
    score_sum += score;
    if (int64_t(result.examples.size()) < run.examples_kept) {
      result.examples.push_back({example.expected, output, score});
    }
    if (routes) {
      NoGradGuard no_grad;
      forward_where_the_model_is(model, single_sequence(prompt));
      kv.add(model, 1);
    }
  }
  result.accuracy = score_sum / double(run.samples);
  result.kv_fraction = kv.mean();
  return result;
}

// ---- multiple choice ----------------------------------------------------------------------

std::vector<ChoiceExample> load_choice_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HAM_CHECK(in, path, ": cannot open multiple-choice file");
  std::vector<ChoiceExample> examples;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      HAM_FAIL(where, ": not valid JSON (", e.what(), ")");
    }
    HAM_CHECK(j.is_object(), where, ": expected a JSON object with keys 'context', 'choices', "
              "'answer', got ", j.type_name());
    for (const char* key : {"context", "choices", "answer"}) {
      HAM_CHECK(j.contains(key), where, ": key '", key, "' is missing");
    }
    ChoiceExample example;
    example.where = where;
    HAM_CHECK(j["context"].is_string(), where, ": key 'context' must be a string, got ",
              j["context"].type_name());
    example.context = j["context"].get<std::string>();
    const nlohmann::json& choices = j["choices"];
    HAM_CHECK(choices.is_array() && choices.size() >= 2, where,
              ": key 'choices' must be an array of at least 2 strings");
    for (size_t c = 0; c < choices.size(); ++c) {
      HAM_CHECK(choices[c].is_string(), where, ": key 'choices': entry ", c,
                " must be a string, got ", choices[c].type_name());
      example.choices.push_back(choices[c].get<std::string>());
      HAM_CHECK(!example.choices.back().empty(), where, ": key 'choices': entry ", c,
                " is empty");
    }
    const nlohmann::json& answer = j["answer"];
    HAM_CHECK(answer.is_number_integer(), where, ": key 'answer' must be an integer, got ",
              answer.type_name());
    example.answer = answer.get<int64_t>();
    HAM_CHECK(example.answer >= 0 && example.answer < int64_t(example.choices.size()), where,
              ": key 'answer' (", example.answer, ") is not an index into the ",
              example.choices.size(), " choices");
    examples.push_back(std::move(example));
  }
  HAM_CHECK(!examples.empty(), path, ": no examples (expected one JSON object per line)");
  return examples;
}

ContinuationTokens continuation_tokens(const Tokenizer& tokenizer, const std::string& context,
                                       const std::string& continuation) {
  size_t kept = context.find_last_not_of(" \t\n\r\f\v");
  kept = kept == std::string::npos ? 0 : kept + 1;
  const std::string head = context.substr(0, kept);
  const std::string tail = context.substr(kept) + continuation;
  std::vector<int64_t> whole = tokenizer.encode(head + tail);
  ContinuationTokens out;
  out.context = tokenizer.encode(head);
  HAM_CHECK(out.context.size() <= whole.size(), "continuation_tokens: the context encodes to "
            "more tokens than context + continuation");
  out.continuation.assign(whole.begin() + std::ptrdiff_t(out.context.size()), whole.end());
  HAM_CHECK(tokenizer.document_start_id() >= 0, "continuation_tokens: tokenizer ",
            tokenizer.name(), " has no document-start token");
  out.context.insert(out.context.begin(), tokenizer.document_start_id());
  return out;
}

double continuation_log_likelihood(const LanguageModel& model, const ContinuationTokens& tokens) {
  HAM_CHECK(!tokens.context.empty() && !tokens.continuation.empty(),
            "continuation_log_likelihood: the context and the continuation must both hold "
            "tokens, got ", tokens.context.size(), " and ", tokens.continuation.size());
  std::vector<int64_t> sequence = tokens.context;
  sequence.insert(sequence.end(), tokens.continuation.begin(), tokens.continuation.end() - 1);
  NoGradGuard no_grad;
  Tensor logits = forward_where_the_model_is(model, single_sequence(sequence));  // [1, T, V]
  const int64_t vocab = logits.size(-1);
  std::vector<float> values = logits.to_vector<float>();
  double sum = 0;
  // Continuation token j is predicted at position |context| - 1 + j.
  for (size_t j = 0; j < tokens.continuation.size(); ++j) {
    const int64_t target = tokens.continuation[j];
    HAM_CHECK(target >= 0 && target < vocab, "continuation_log_likelihood: token ", target,
              " is outside the model's vocabulary of ", vocab);
    const size_t position = tokens.context.size() - 1 + j;
    sum += log_probability(values.data() + position * size_t(vocab), vocab, target);
  }
  return sum;
}

ChoiceResult evaluate_multiple_choice(const LanguageModel& model, const Tokenizer& tokenizer,
                                      const std::vector<ChoiceExample>& examples,
                                      std::string name) {
  HAM_CHECK(!examples.empty(), "evaluate_multiple_choice: ", name, ": no examples");
  ChoiceResult result;
  result.name = std::move(name);
  result.examples = int64_t(examples.size());
  KvFractionMean kv;
  int64_t correct = 0, correct_norm = 0;
  for (const ChoiceExample& example : examples) {
    std::vector<double> scores, normalised;
    for (size_t c = 0; c < example.choices.size(); ++c) {
      ContinuationTokens tokens =
          continuation_tokens(tokenizer, example.context, example.choices[c]);
      HAM_CHECK(!tokens.continuation.empty(), example.where, ": key 'choices': entry ", c,
                " adds no token to the context");
      double ll = continuation_log_likelihood(model, tokens);
      kv.add(model, 1);
      scores.push_back(ll);
      normalised.push_back(ll / double(utf8_length(example.choices[c])));
    }
    correct += argmax(scores.data(), int64_t(scores.size())) == example.answer;
    correct_norm += argmax(normalised.data(), int64_t(normalised.size())) == example.answer;
  }
  result.acc = double(correct) / double(examples.size());
  result.acc_norm = double(correct_norm) / double(examples.size());
  result.kv_fraction = kv.mean();
  return result;
}

// ---- everything at once -------------------------------------------------------------------

void EvalOptions::validate() const {
  HAM_CHECK(seq_len >= 1, "eval option seq_len must be >= 1, got ", seq_len);
  HAM_CHECK(batch_size >= 1, "eval option batch_size must be >= 1, got ", batch_size);
  HAM_CHECK(max_batches >= 0, "eval option max_batches must be >= 0, got ", max_batches);
  HAM_CHECK(samples >= 1, "eval option samples must be >= 1, got ", samples);
  HAM_CHECK(mqar_pairs >= 1, "eval option mqar_pairs must be >= 1, got ", mqar_pairs);
  HAM_CHECK(niah_margin_tokens >= 0, "eval option niah_margin_tokens must be >= 0, got ",
            niah_margin_tokens);
  for (int64_t length : mqar_lengths) {
    HAM_CHECK(length >= 4 * mqar_pairs, "eval option mqar_lengths: ", length, " is shorter than "
              "4 x mqar_pairs = ", 4 * mqar_pairs);
  }
  HAM_CHECK(niah_tasks.empty() == niah_lengths.empty(), "eval options niah_tasks and "
            "niah_lengths go together: got ", niah_tasks.size(), " tasks and ",
            niah_lengths.size(), " lengths");
  for (const std::string& task : niah_tasks) niah_kind_from_name(task);  // names the bad one
  for (int64_t length : niah_lengths) {
    HAM_CHECK(length >= 1, "eval option niah_lengths: ", length, " must be >= 1");
  }
}

nlohmann::json EvalOptions::to_json() const {
  return {{"perplexity", perplexity}, {"data_path", data_path}, {"tokenizer", tokenizer},
          {"seq_len", seq_len}, {"batch_size", batch_size}, {"max_batches", max_batches},
          {"mqar_lengths", mqar_lengths}, {"mqar_pairs", mqar_pairs},
          {"niah_tasks", niah_tasks}, {"niah_lengths", niah_lengths}, {"samples", samples},
          {"niah_margin_tokens", niah_margin_tokens}, {"choice_files", choice_files},
          {"seed", seed}};
}

void EvalOptions::update_from_json(const nlohmann::json& j, const std::string& source) {
  HAM_CHECK(j.is_object(), source, ": eval options must be a JSON object");
  nlohmann::json merged = to_json();
  for (const auto& item : j.items()) {
    HAM_CHECK(merged.contains(item.key()), source, ": unknown eval option '", item.key(), "'");
    const nlohmann::json& was = merged[item.key()];
    bool same_type = std::string(item.value().type_name()) == was.type_name() ||
                     (item.value().is_number() && was.is_number());
    HAM_CHECK(same_type, source, ": eval option '", item.key(), "' must be a ", was.type_name(),
              ", got ", item.value().dump());
    merged[item.key()] = item.value();
  }
  EvalOptions o;
  try {
    o.perplexity = merged.at("perplexity").get<bool>();
    o.data_path = merged.at("data_path").get<std::string>();
    o.tokenizer = merged.at("tokenizer").get<std::string>();
    o.seq_len = merged.at("seq_len").get<int64_t>();
    o.batch_size = merged.at("batch_size").get<int64_t>();
    o.max_batches = merged.at("max_batches").get<int64_t>();
    o.mqar_lengths = merged.at("mqar_lengths").get<std::vector<int64_t>>();
    o.mqar_pairs = merged.at("mqar_pairs").get<int64_t>();
    o.niah_tasks = merged.at("niah_tasks").get<std::vector<std::string>>();
    o.niah_lengths = merged.at("niah_lengths").get<std::vector<int64_t>>();
    o.samples = merged.at("samples").get<int64_t>();
    o.niah_margin_tokens = merged.at("niah_margin_tokens").get<int64_t>();
    o.choice_files = merged.at("choice_files").get<std::vector<std::string>>();
    o.seed = merged.at("seed").get<uint64_t>();
  } catch (const nlohmann::json::exception& e) {
    HAM_FAIL(source, ": eval options: a list holds a value of the wrong type: ", e.what());
  }
  *this = o;
}

nlohmann::json EvalReport::to_json() const {
  nlohmann::json j = {{"model", {{"family", family}, {"source", source}, {"step", step},
                                 {"parameters", parameters}, {"tau", tau}}},
                      {"options", options}, {"generation", generation}};
  j["perplexity"] = nullptr;
  if (perplexity) {
    const PerplexityResult& p = *perplexity;
    j["perplexity"] = {{"data", p.data}, {"seq_len", p.seq_len}, {"sequences", p.sequences},
                       {"tokens", p.tokens}, {"mean_loss", p.mean_loss},
                       {"perplexity", p.perplexity}, {"kv_fraction", p.kv_fraction}};
    if (p.bytes > 0) {
      j["perplexity"]["bytes"] = p.bytes;
      j["perplexity"]["bits_per_byte"] = p.bits_per_byte;
    }
  }
  j["mqar"] = nlohmann::json::array();
  for (const MqarResult& m : mqar) {
    j["mqar"].push_back({{"seq_len", m.seq_len}, {"num_pairs", m.num_pairs},
                         {"samples", m.samples}, {"queries", m.queries},
                         {"accuracy", m.accuracy}, {"sequence_accuracy", m.sequence_accuracy},
                         {"kv_fraction", m.kv_fraction}});
  }
  j["niah"] = nlohmann::json::array();
  for (const NiahResult& n : niah) {
    nlohmann::json examples = nlohmann::json::array();
    for (const NiahSample& s : n.examples) {
      examples.push_back({{"expected", s.expected}, {"output", s.output}, {"score", s.score}});
    }
    j["niah"].push_back({{"task", n.task}, {"context_tokens", n.context_tokens},
                         {"samples", n.samples}, {"accuracy", n.accuracy},
                         {"kv_fraction", n.kv_fraction}, {"examples", examples}});
  }
  j["choices"] = nlohmann::json::array();
  for (const ChoiceResult& c : choices) {
    j["choices"].push_back({{"name", c.name}, {"examples", c.examples}, {"acc", c.acc},
                            {"acc_norm", c.acc_norm}, {"kv_fraction", c.kv_fraction}});
  }
  return j;
}

std::vector<std::vector<std::string>> EvalReport::rows() const {
  std::vector<std::vector<std::string>> rows;
  if (perplexity) {
    const PerplexityResult& p = *perplexity;
    rows.push_back({"perplexity", std::to_string(p.seq_len), std::to_string(p.sequences),
                    fmt::format("loss {:.4f}  ppl {:.3f}  {}tokens {}", p.mean_loss, p.perplexity,
                                p.bytes > 0 ? fmt::format("bpb {:.4f}  ", p.bits_per_byte) : "", p.tokens),
                    kv_fraction_cell(p.kv_fraction)});
  }
  for (const MqarResult& m : mqar) {
    rows.push_back({fmt::format("mqar {} pairs", m.num_pairs), std::to_string(m.seq_len),
                    std::to_string(m.samples),
                    fmt::format("acc {:.4f}  seq_acc {:.4f}", m.accuracy, m.sequence_accuracy),
                    kv_fraction_cell(m.kv_fraction)});
  }
  for (const NiahResult& n : niah) {
    rows.push_back({"niah " + n.task, std::to_string(n.context_tokens), std::to_string(n.samples),
                    fmt::format("acc {:.4f}", n.accuracy), kv_fraction_cell(n.kv_fraction)});
  }
  for (const ChoiceResult& c : choices) {
    rows.push_back({"choices " + std::filesystem::path(c.name).filename().string(), "-",
                    std::to_string(c.examples),
                    fmt::format("acc {:.4f}  acc_norm {:.4f}", c.acc, c.acc_norm),
                    kv_fraction_cell(c.kv_fraction)});
  }
  return rows;
}

std::vector<EvalMetric> EvalReport::metrics() const {
  std::vector<EvalMetric> out;
  if (perplexity) {
    out.push_back({fmt::format("perplexity (T={})", perplexity->seq_len), perplexity->perplexity});
    if (perplexity->bytes > 0) {
      out.push_back({fmt::format("bits per byte (T={})", perplexity->seq_len), perplexity->bits_per_byte});
    }
  }
  for (const MqarResult& m : mqar) {
    out.push_back({fmt::format("MQAR T={} acc", m.seq_len), m.accuracy});
    out.push_back({fmt::format("MQAR T={} all-correct", m.seq_len), m.sequence_accuracy});
  }
  for (const NiahResult& n : niah) {
    out.push_back({fmt::format("NIAH {} T={}", n.task, n.context_tokens), n.accuracy});
  }
  for (const ChoiceResult& c : choices) {
    out.push_back({c.name + " acc", c.acc});
    out.push_back({c.name + " acc_norm", c.acc_norm});
  }
  return out;
}

double EvalReport::mean_kv_fraction() const {
  double total = 0;
  int64_t tasks = 0;
  auto add = [&](const std::vector<double>& per_layer) {
    if (per_layer.empty()) return;
    double layers = 0;
    for (double f : per_layer) layers += f;
    total += layers / double(per_layer.size());
    ++tasks;
  };
  if (perplexity) add(perplexity->kv_fraction);
  for (const MqarResult& m : mqar) add(m.kv_fraction);
  for (const NiahResult& n : niah) add(n.kv_fraction);
  for (const ChoiceResult& c : choices) add(c.kv_fraction);
  return tasks > 0 ? total / double(tasks) : std::nan("");
}

std::string EvalReport::table() const {
  std::vector<std::vector<std::string>> rows = {
      {"task", "length", "samples", "metrics", "kv fraction: mean [per layer]"}};
  for (std::vector<std::string>& row : this->rows()) rows.push_back(std::move(row));
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string header = fmt::format("model: {} ({} parameters) from {}", family, parameters,
                                   source.empty() ? std::string("<in memory>") : source);
  if (step >= 0) header += fmt::format(", step {}", step);
  if (!tau.empty()) {
    header += ", tau";
    for (double t : tau) header += fmt::format(" {:.4g}", t);
  }
  std::string out = header + "\n";
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // Numbers right-aligned, text left-aligned; two spaces between columns.
      const bool numeric = c == 1 || c == 2;
      std::string cell = numeric ? fmt::format("{:>{}}", row[c], widths[c])
                                 : fmt::format("{:<{}}", row[c], widths[c]);
      line += (c ? "  " : "") + cell;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

EvalReport evaluate_model(const LanguageModel& model, const EvalOptions& options,
                          const Completer& complete, std::ostream* progress) {
  options.validate();
  using Clock = std::chrono::steady_clock;
  Clock::time_point task_start = Clock::now();
  // The row of the task just finished is the report's last: rows() lists them in run order.
  auto task_done = [&](const EvalReport& so_far) {
    if (progress == nullptr) return;
    const std::vector<std::string> row = so_far.rows().back();
    const double seconds = std::chrono::duration<double>(Clock::now() - task_start).count();
    const std::string at_length = row[1] == "-" ? "" : " at " + row[1];
    *progress << fmt::format("eval: {}{} ({} samples): {} | kv {} | {:.1f} s\n", row[0],
                             at_length, row[2], row[3], row[4], seconds)
              << std::flush;
    task_start = Clock::now();
  };
  const ModelConfig& config = model.config();
  EvalReport report;
  report.family = family_name(config.family);
  report.parameters = model.num_parameters();
  report.options = options.to_json();
  for (const LayerRouting& layer : model.routing()) report.tau.push_back(layer.tau);
  // The data's tokenizer: bits per byte, NIAH prompts and multiple-choice text.
  const bool reads_text = !options.niah_tasks.empty() || !options.choice_files.empty();
  std::unique_ptr<Tokenizer> tokenizer;
  if (reads_text || options.perplexity) tokenizer = load_tokenizer(options.tokenizer);
  if (reads_text) {
    HAM_CHECK(config.vocab_size >= tokenizer->vocab_size(), "model config: key 'vocab_size' (",
              config.vocab_size, ") is smaller than the tokenizer's vocabulary (",
              tokenizer->vocab_size(), ", ", options.tokenizer, ")");
    HAM_CHECK(options.niah_tasks.empty() || bool(complete),
              "evaluate_model: NIAH tasks need a completer");
  }
  if (options.perplexity) {
    TrainOptions data_options;
    data_options.data_path = options.data_path;
    data_options.tokenizer = options.tokenizer;
    TrainingData data = open_training_data(data_options, config);
    // Text: the documents training held out; shards: the files given, whole.
    const bool shards = is_shard_spec(options.data_path);
    const TokenSource& source = shards ? *data.train : *data.val;
    std::string description =
        shards ? data.description : data.description + " (held-out 5% of documents)";
    report.perplexity = evaluate_perplexity(model, source, options.batch_size, options.seq_len,
                                            options.max_batches, description, tokenizer.get());
    task_done(report);
  }
  for (int64_t length : options.mqar_lengths) {
    MqarConfig mqar;
    mqar.vocab_size = config.vocab_size;
    mqar.seq_len = length;
    mqar.num_pairs = options.mqar_pairs;
    mqar.seed = options.seed;
    report.mqar.push_back(evaluate_mqar(model, mqar, options.samples, options.batch_size));
    task_done(report);
  }
  for (const std::string& task : options.niah_tasks) {
    for (int64_t length : options.niah_lengths) {
      NiahRun run;
      run.kind = niah_kind_from_name(task);
      run.context_tokens = length;
      run.samples = options.samples;
      run.seed = options.seed;
      run.margin_tokens = options.niah_margin_tokens;
      report.niah.push_back(evaluate_niah(model, *tokenizer, complete, run));
      task_done(report);
    }
  }
  for (const std::string& path : options.choice_files) {
    report.choices.push_back(
        evaluate_multiple_choice(model, *tokenizer, load_choice_file(path), path));
    task_done(report);
  }
  return report;
}

}  // namespace ham

// ham generate: continue a prompt with a trained model, and show what the decoder keeps
// per layer (KV cache tokens and bytes, recurrent and conv state) - HAM's memory/quality
// dial, turned with --tau or --kv-fraction.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/file_io.h"
#include "train/cli/commands.h"
#include "train/sampling.h"
#include "train/tokenizer.h"
#include "train/trained_model.h"

namespace ham::cli {

namespace {

struct GenerateArgs {
  std::string model_dir, prompt, prompt_file, tokenizer;  // "": the model's own
  GenerateOptions options;
  std::vector<std::string> taus;  // "TAU" (every layer) or "LAYER:TAU"
  std::optional<double> kv_fraction;
  bool ignore_eot = false;
  int threads = 0;
  std::string device = "cpu", precision = "f32";
};

double parse_number(const std::string& text, const std::string& flag_value) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  HAM_CHECK(used == text.size() && !text.empty(), "--tau ", flag_value, ": '", text,
            "' is not a number (expected TAU or LAYER:TAU)");
  return value;
}

// --tau X sets every HAM layer; --tau L:X one layer (repeatable, wins over X).
RoutingOverride routing_from(const GenerateArgs& args) {
  RoutingOverride r;
  for (const std::string& spec : args.taus) {
    size_t colon = spec.find(':');
    if (colon == std::string::npos) {
      HAM_CHECK(!r.tau, "--tau ", spec, ": a tau for every layer was already given (", *r.tau, ")");
      r.tau = parse_number(spec, spec);
      continue;
    }
    std::string layer_text = spec.substr(0, colon);
    size_t used = 0;
    int64_t layer = -1;
    try {
      layer = std::stoll(layer_text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HAM_CHECK(used == layer_text.size() && !layer_text.empty() && layer >= 0, "--tau ", spec,
              ": '", layer_text, "' is not a layer index (expected LAYER:TAU)");
    HAM_CHECK(!r.layer_tau.count(layer), "--tau ", spec, ": layer ", layer, " was already given");
    r.layer_tau[layer] = parse_number(spec.substr(colon + 1), spec);
  }
  r.kv_fraction = args.kv_fraction;
  return r;
}

std::string read_prompt(const GenerateArgs& args) {
  if (args.prompt_file.empty()) return args.prompt;
  return read_file(args.prompt_file, "the --prompt-file");
}

std::string bytes_str(int64_t bytes) {
  if (bytes >= 1000000000) return fmt::format("{:.2f} GB", double(bytes) / 1e9);
  if (bytes >= 1000000) return fmt::format("{:.2f} MB", double(bytes) / 1e6);
  if (bytes >= 1000) return fmt::format("{:.1f} kB", double(bytes) / 1e3);
  return fmt::format("{} B", bytes);
}

void print_state(const GenerateResult& r) {
  std::cout << fmt::format("decoder state after {} tokens (KV cache per layer, one sequence):\n",
                           r.context_tokens);
  std::cout << fmt::format("  {:<5} {:<9} {:>8}  {:>22}  {:>10}  {:>15}  {:>10}\n", "layer", "kind",
                           "tau", "KV cache tokens", "KV bytes", "recurrent bytes", "conv bytes");
  for (const LayerCacheStats& s : r.layers) {
    std::string tokens = "-";
    if (!s.kv_tokens.empty()) {
      int64_t cached = s.kv_tokens[0];
      tokens = fmt::format("{} / {} ({:.1f}%)", cached, r.context_tokens,
                           100.0 * double(cached) / double(std::max<int64_t>(r.context_tokens, 1)));
    }
    std::cout << fmt::format("  {:<5} {:<9} {:>8}  {:>22}  {:>10}  {:>15}  {:>10}\n", s.layer,
                             layer_kind_name(s.kind), s.tau ? fmt::format("{:.4f}", *s.tau) : "-",
                             tokens, bytes_str(s.kv_bytes), bytes_str(s.recurrent_bytes),
                             bytes_str(s.conv_bytes));
  }
  std::cout << fmt::format(
      "total: KV cache {} ({} B), recurrent state {} ({} B), conv state {} ({} B); all {}\n",
      bytes_str(r.bytes.kv), r.bytes.kv, bytes_str(r.bytes.recurrent), r.bytes.recurrent,
      bytes_str(r.bytes.conv), r.bytes.conv, bytes_str(r.bytes.total()));
}

int run_generate(GenerateArgs args) {
  use_threads(args.threads);
  TrainedModel trained = load_trained_model(args.model_dir);
  trained.model->to(Device::parse(args.device));
  if (args.precision == "bf16") trained.model->to(DType::BF16);  // f32 where the model keeps it
  const LanguageModel& model = *trained.model;
  const ModelConfig& c = model.config();
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(args.tokenizer.empty() ? trained.tokenizer : args.tokenizer);
  HAM_CHECK(tokenizer->vocab_size() <= c.vocab_size, "--tokenizer ", tokenizer->name(), ": ",
            tokenizer->vocab_size(), " token ids, but the model's vocabulary has ", c.vocab_size);
  args.options.routing = routing_from(args);
  if (!args.ignore_eot && tokenizer->eot_id() >= 0) args.options.stop_token = tokenizer->eot_id();

  // Training documents start with the document-start token, so the prompt does too.
  std::vector<int64_t> prompt = {tokenizer->document_start_id()};
  std::vector<int64_t> text_ids = tokenizer->encode(read_prompt(args));
  prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());

  std::cout << fmt::format("model: {} ({}{}), {} parameters; tokenizer {}\n", trained.source,
                           family_name(c.family),
                           trained.step >= 0 ? fmt::format(", step {}", trained.step) : "",
                           model.num_parameters(), tokenizer->name());
  std::cout << fmt::format("prompt: {} tokens (document start + {})\n", prompt.size(), text_ids.size());
  // The continuation is printed as it is drawn: what decoding every token so far adds to
  // the text already printed (decode's text only grows at its end as tokens are added).
  std::vector<int64_t> drawn;
  std::string printed;
  args.options.on_token = [&](int64_t token) {
    drawn.push_back(token);
    std::string text = tokenizer->decode(drawn);
    HAM_CHECK(text.compare(0, printed.size(), printed) == 0, "generate: decoding token ", token,
              " changed the text printed before it");
    std::cout << std::string_view(text).substr(printed.size()) << std::flush;
    printed = std::move(text);
  };
  std::cout << "--- continuation ---\n" << std::flush;
  GenerateResult r = generate(model, prompt, args.options);
  std::cout << "\n";
  std::cout << fmt::format("--- end: {} new tokens, {} ---\n", r.tokens.size(),
                           r.stopped ? fmt::format("stopped at end-of-text token {}", *args.options.stop_token)
                                     : std::string("--max-new-tokens reached"));
  const int64_t decoded = r.context_tokens - int64_t(prompt.size());  // feeds after the prompt
  std::cout << fmt::format("speed ({}, {}): prompt {} tokens in {:.3f} s ({:.0f} tokens/s)",
                           args.device, args.precision, prompt.size(), r.prompt_seconds,
                           double(prompt.size()) / std::max(r.prompt_seconds, 1e-9));
  if (decoded > 0) {
    std::cout << fmt::format("; {} tokens decoded one at a time in {:.3f} s ({:.3f} ms/token)",
                             decoded, r.decode_seconds, 1e3 * r.decode_seconds / double(decoded));
  }
  std::cout << "\n";
  print_state(r);
  return 0;
}

}  // namespace

Command add_generate_command(CLI::App& root) {
  auto args = std::make_shared<GenerateArgs>();
  SamplingOptions& s = args->options.sampling;
  CLI::App* cmd = root.add_subcommand(
      "generate", "Continue a prompt with a trained model; prints the KV cache and state each layer keeps");
  cmd->add_option("model", args->model_dir,
                  "Checkpoint directory, training output directory (newest checkpoint) or `ham train --export` directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  CLI::Option* prompt = cmd->add_option("--prompt", args->prompt, "Prompt text");
  CLI::Option* prompt_file = cmd->add_option("--prompt-file", args->prompt_file, "Read the prompt from this file")
                                 ->check(CLI::ExistingFile);
  prompt->excludes(prompt_file);
  prompt_file->excludes(prompt);
  cmd->add_option("--max-new-tokens", args->options.max_new_tokens, "Tokens to generate at most")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", s.temperature, "Sampling temperature; 0 is greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "Nucleus sampling: the smallest set with this probability mass (1: all)")
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "Sampling seed (a run is reproducible from it)")->capture_default_str();
  cmd->add_option("--tau", args->taus,
                  "HAM: routing threshold for every layer (--tau 0.8) or one layer (--tau 1:0.8); repeatable");
  cmd->add_option("--kv-fraction", args->kv_fraction,
                  "HAM: per layer, set tau on the prompt so that this fraction of its tokens enters the KV cache");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "'bytes' or a Hugging Face tokenizer.json, which must match the model's training data (default: the tokenizer.json saved with the model, else bytes)");
  cmd->add_flag("--ignore-eot", args->ignore_eot, "Keep generating past the end-of-text token");
  add_threads_option(cmd, &args->threads);
  cmd->add_option("--device", args->device, "cpu, cuda or cuda:N: where the model decodes")
      ->capture_default_str()
      ->check(device_check);
  cmd->add_option("--precision", args->precision,
                  "f32, or bf16 (weights and activations; decoding states and HAM's routers stay f32)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->callback([cmd, prompt, prompt_file] {
    if (prompt->count() == 0 && prompt_file->count() == 0) {
      throw CLI::RequiredError("--prompt or --prompt-file");
    }
  });
  return {cmd, [args] { return run_generate(*args); }};
}

}  // namespace ham::cli

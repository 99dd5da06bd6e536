// ham tokenize: text files -> llm.c token shards; ham detokenize: a shard -> text;
// ham train-tokenizer: text files -> a byte-level BPE tokenizer.json.
#include <iostream>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "train/bpe_training.h"
#include "train/cli/commands.h"
#include "train/shards.h"
#include "train/tokenizer.h"

namespace ham::cli {

namespace {

constexpr const char* kTokenizerHelp =
    "'bytes' (ids 0-255 are bytes, 256 is <|endoftext|>) or a Hugging Face tokenizer.json "
    "with a BPE model (GPT-2 byte-level or Llama-2 sentencepiece style)";

struct TokenizeArgs {
  std::string tokenizer = "bytes";
  std::vector<std::string> inputs;
  std::string out_prefix;
  TokenizeOptions options;
};

void print_split(const char* split, int64_t documents, int64_t tokens, const std::vector<std::string>& shards) {
  std::cout << fmt::format("{}: {} documents, {} tokens in {} shard{}\n", split, documents, tokens,
                           shards.size(), shards.size() == 1 ? "" : "s");
  for (const auto& path : shards) std::cout << "  " << path << "\n";
}

int run_tokenize(const TokenizeArgs& args) {
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(args.tokenizer);
  prepare_output_file(args.out_prefix, "--out");  // the shards are PREFIX_<split>_NNNNNN.bin
  TokenizeSummary s = tokenize_to_shards(*tokenizer, args.inputs, args.out_prefix, args.options);
  std::cout << fmt::format("tokenizer: {}; documents start with token {}; uint{} shards\n", tokenizer->name(),
                           tokenizer->document_start_id(), 8 * s.token_width);
  print_split("train", s.train_documents, s.train_tokens, s.train_shards);
  if (s.val_documents > 0) print_split("val", s.val_documents, s.val_tokens, s.val_shards);
  return 0;
}

struct DetokenizeArgs {
  std::string tokenizer = "bytes";
  std::string input;
  int64_t max_tokens = 0;
};

int run_detokenize(const DetokenizeArgs& args) {
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(args.tokenizer);
  Shard shard = Shard::open(args.input, tokenizer->vocab_size());
  int64_t count = args.max_tokens > 0 ? std::min(args.max_tokens, shard.size()) : shard.size();
  std::vector<int64_t> ids(static_cast<size_t>(count));
  shard.read(0, count, ids.data());
  std::cout << tokenizer->decode(ids);
  std::cout.flush();
  return 0;
}

struct TrainTokenizerArgs {
  std::vector<std::string> inputs;
  std::string out;
  BpeTrainingOptions options;
  int threads = 0;
};

int run_train_tokenizer(const TrainTokenizerArgs& args) {
  use_threads(args.threads);
  prepare_output_file(args.out, "--out");
  BpeTrainingSummary s = train_bpe_tokenizer(args.inputs, args.out, args.options);
  const LearnedMerges& learned = s.learned;
  std::cout << fmt::format("documents: {}{}; {} pre-tokens, {} distinct, counted in {:.3f} s\n", s.documents,
                           s.held_out_documents > 0 ? fmt::format(" ({} held out)", s.held_out_documents) : "",
                           s.pretokens, s.distinct_words, s.counting_seconds);
  std::cout << fmt::format("merges: {} in {:.3f} s; {}\n", learned.merges.size(), s.merging_seconds,
                           learned.vocabulary_full
                               ? fmt::format("the vocabulary is full ({} ids)", learned.pieces.size())
                               : fmt::format("stopped at {} ids: no pair occurs {} times", learned.pieces.size(),
                                             args.options.min_frequency));
  std::cout << fmt::format("the training documents' {} bytes encode to {} tokens ({:.2f} bytes a token)\n",
                           learned.symbols_before, learned.symbols_after,
                           double(learned.symbols_before) / double(std::max<int64_t>(1, learned.symbols_after)));
  std::cout << fmt::format("wrote {}: <|endoftext|> is id {}, bytes are ids 0-255\n", args.out,
                           LearnedMerges::kEndOfText);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& root) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = root.add_subcommand(
      "tokenize", "Tokenize text files into llm.c token shards PREFIX_train_000000.bin, PREFIX_val_000000.bin, ...");
  cmd->add_option("--tokenizer", args->tokenizer, kTokenizerHelp)->capture_default_str();
  cmd->add_option("--in", args->inputs, "Text files; documents end at lines holding only '<|endoftext|>'")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out_prefix, "Output path prefix")->required();
  cmd->add_option("--shard-tokens", args->options.shard_tokens, "Tokens per shard")->capture_default_str();
  cmd->add_option("--val-fraction", args->options.validation_fraction,
                  "Fraction of documents (the last ones) written to the validation shards")
      ->capture_default_str();
  cmd->add_flag("--one-doc-per-file", args->options.one_document_per_file,
                "Each file is one document ('<|endoftext|>' lines are ordinary text)");
  return {cmd, [args] { return run_tokenize(*args); }};
}

Command add_detokenize_command(CLI::App& root) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* cmd = root.add_subcommand("detokenize", "Print the text of an llm.c token shard");
  cmd->add_option("--tokenizer", args->tokenizer, kTokenizerHelp)->capture_default_str();
  cmd->add_option("--in", args->input, "Shard file (.bin)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--max-tokens", args->max_tokens, "Decode at most this many tokens (0: all)")
      ->capture_default_str();
  return {cmd, [args] { return run_detokenize(*args); }};
}

Command add_train_tokenizer_command(CLI::App& root) {
  auto args = std::make_shared<TrainTokenizerArgs>();
  CLI::App* cmd = root.add_subcommand(
      "train-tokenizer",
      "Learn a byte-level BPE tokenizer (GPT-2 style) from text files and write it as a Hugging Face "
      "tokenizer.json for ham tokenize, ham train --tokenizer and Hugging Face's tokenizers");
  cmd->add_option("--in", args->inputs, "Text files; documents end at lines holding only '<|endoftext|>'")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out, "The tokenizer.json to write")->required();
  cmd->add_option("--vocab-size", args->options.vocab_size,
                  "Ids in all: the 256 bytes, <|endoftext|> (id 256) and the merges")
      ->capture_default_str()
      ->check(whole_number_at_least(257));
  cmd->add_option("--min-frequency", args->options.min_frequency,
                  "Stop before the vocabulary is full when no pair occurs this many times")
      ->capture_default_str()
      ->check(whole_number_at_least(1));
  cmd->add_option("--val-fraction", args->options.validation_fraction,
                  "Leave out the last documents, as ham tokenize --val-fraction holds them out, so the "
                  "tokenizer never sees the validation text")
      ->capture_default_str();
  cmd->add_flag("--one-doc-per-file", args->options.one_document_per_file,
                "Each file is one document ('<|endoftext|>' lines are ordinary text)");
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_train_tokenizer(*args); }};
}

}  // namespace ham::cli

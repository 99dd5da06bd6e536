#include "train/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace ham {
namespace {

// Single draws from a Generator, each reserving one Philox block. below() reads the block
// exactly as a one-element randint would, so it follows the stream layout of core/random.h.
class Draws {
 public:
  explicit Draws(Generator& gen) : gen_(gen) {}

  PhiloxBlock block() { return rng::stream_block(gen_.seed(), gen_.advance(1)); }
  uint64_t below(uint64_t range) {  // uniform in [0, range), range >= 1
    uint64_t counter = gen_.advance(1);
    return rng::bounded_from_block(rng::stream_block(gen_.seed(), counter), gen_.seed(),
                                   counter, 0, range);
  }
  double unit() {  // uniform in [0, 1)
    PhiloxBlock b = block();
    return rng::unit_from_53_bits(b.word[0], b.word[1]);
  }
  double unit_open_at_zero() {  // uniform in (0, 1], so that log() is finite
    PhiloxBlock b = block();
    return (double(rng::top_53_bits(b.word[0], b.word[1])) + 1.0) * 0x1p-53;
  }
  uint64_t bits64() {
    PhiloxBlock b = block();
    return (uint64_t(b.word[0]) << 32) | b.word[1];
  }
  template <size_t N>
  std::string_view pick(const std::string_view (&words)[N]) {
    return words[below(N)];
  }

 private:
  Generator& gen_;
};

// `count` distinct integers from [low, high) in random order: Fisher-Yates on a virtual
// array, storing only the swapped slots, so large ranges cost nothing.
std::vector<int64_t> sample_distinct(int64_t low, int64_t high, int64_t count, Draws& draws) {
  std::unordered_map<int64_t, int64_t> swapped;
  auto slot = [&](int64_t i) {
    auto it = swapped.find(i);
    return it == swapped.end() ? i : it->second;
  };
  int64_t n = high - low;
  std::vector<int64_t> out;
  out.reserve(size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    int64_t j = i + int64_t(draws.below(uint64_t(n - i)));
    int64_t chosen = slot(j);
    swapped[j] = slot(i);
    out.push_back(low + chosen);
  }
  return out;
}

// ---- Word lists (written for this project) ----------------------------------------------

// Keys and "words" values are adjective-noun pairs from these lists.
constexpr std::string_view kKeyAdjectives[] = {
    "abundant", "adorable", "agreeable", "ancient",  "angry",    "anxious",   "bashful",
    "bitter",   "black",    "blue",     "boiling",  "brave",    "breezy",    "brief",
    "bright",   "broad",    "broken",   "bumpy",    "calm",     "careful",   "cheerful",
    "chilly",   "clean",    "clever",   "cloudy",   "clumsy",   "cold",      "colossal",
    "cool",     "crooked",  "cuddly",   "curly",    "curved",   "damp",      "dark",
    "deep",     "dizzy",    "dry",      "dusty",    "eager",    "early",     "elegant",
    "empty",    "enormous", "faint",    "fancy",    "fast",     "fierce",    "flat",
    "fluffy",   "fresh",    "friendly", "fuzzy",    "gentle",   "giant",     "gifted",
    "gleaming", "glorious", "golden",   "graceful", "green",    "grumpy",    "handsome",
    "happy",    "heavy",    "helpful",  "hollow",   "huge",     "humble",    "icy",
    "jolly",    "kind",     "large",    "lazy",     "little",   "lively",    "lonely",
    "loud",     "lucky",    "mellow",   "melodic",  "misty",    "modern",    "narrow",
    "nervous",  "nimble",   "noisy",    "odd",      "old",      "orange",    "polite",
    "proud",    "purple",   "quick",    "quiet",    "rapid",    "red",       "rich",
    "round",    "rusty",    "salty",    "scary",    "shaggy",   "shallow",   "sharp",
    "shiny",    "short",    "silent",   "silky",    "silly",    "slow",      "small",
    "smooth",   "soft",     "sour",     "sparkling", "spicy",   "steep",     "sticky",
    "stormy",   "strong",   "sweet",    "swift",    "tall",     "tame",      "tender",
    "thick",    "thin",     "tiny",     "tough",    "wandering", "warm",     "wet",
    "wide",     "wild",     "windy",    "wise",     "witty",    "wooden",    "young",
    "zealous"};

constexpr std::string_view kKeyNouns[] = {
    "acorn",    "anchor",    "apple",     "arrow",    "badge",    "bakery",   "balloon",
    "banjo",    "barrel",    "basket",    "beacon",   "bicycle",  "blanket",  "bottle",
    "bridge",   "bucket",    "button",    "cabin",    "cactus",   "camera",   "candle",
    "canoe",    "canyon",    "carpet",    "castle",   "cello",    "chimney",  "clock",
    "cloud",    "compass",   "cookie",    "cottage",  "crayon",   "crystal",  "cushion",
    "desert",   "diamond",   "dolphin",   "dragon",   "drum",     "eagle",    "engine",
    "falcon",   "feather",   "fiddle",    "forest",   "fountain", "garden",   "giraffe",
    "glacier",  "guitar",    "hammer",    "harbor",   "helmet",   "island",   "jacket",
    "jungle",   "kettle",    "kitten",    "ladder",   "lantern",  "lemon",    "lighthouse",
    "lizard",   "magnet",    "maple",     "meadow",   "mirror",   "mountain", "notebook",
    "ocean",    "orchard",   "otter",     "owl",      "paddle",   "panda",    "parrot",
    "pebble",   "pencil",    "pepper",    "piano",    "pillow",   "planet",   "pocket",
    "pumpkin",  "puzzle",    "quilt",     "rabbit",   "radio",    "raven",    "ribbon",
    "river",    "rocket",    "saddle",    "sandal",   "scarf",    "shell",    "shovel",
    "spider",   "spoon",     "squirrel",  "statue",   "stone",    "sunflower", "teapot",
    "telescope", "tiger",    "tractor",   "trumpet",  "tulip",    "turtle",   "umbrella",
    "valley",   "violin",    "volcano",   "wagon",    "walnut",   "whistle",  "window",
    "wizard",   "zebra"};

// Essay vocabulary. Nouns and verbs are regular, so plural() and third_person() inflect them.
constexpr std::string_view kEssayPeople[] = {
    "founder",  "engineer", "writer",    "student",    "investor", "reader",  "programmer",
    "teacher",  "designer", "customer",  "manager",    "scientist", "painter", "builder",
    "beginner", "expert",   "critic",    "parent",     "friend",   "editor",  "researcher",
    "hacker",   "artist",   "user",      "architect"};

constexpr std::string_view kEssayThings[] = {
    "idea",     "product",  "problem",  "company",  "essay",     "project",  "question",
    "mistake",  "habit",    "tool",     "language", "market",    "city",     "book",
    "plan",     "method",   "theory",   "experiment", "draft",   "program",  "design",
    "rule",     "story",    "lesson",   "argument", "reason",    "decision", "skill",
    "process",  "feature",  "detail",   "system",   "pattern",   "choice",   "goal",
    "office",   "meeting",  "startup",  "conversation", "prototype", "schedule", "budget",
    "opinion",  "ambition", "deadline"};

constexpr std::string_view kEssayVerbs[] = {
    "build",    "ignore",    "notice",   "change",   "improve",  "explain",  "test",
    "question", "study",     "solve",    "abandon",  "choose",   "write",    "rewrite",
    "share",    "measure",   "learn",    "teach",    "sell",     "fund",     "copy",
    "simplify", "describe",  "discover", "admire",   "fear",     "want",     "need",
    "understand", "follow",  "reject",   "revisit",  "finish",   "start",    "underestimate",
    "polish",   "defend",    "trust",    "misjudge", "replace"};

constexpr std::string_view kEssayAdjectives[] = {
    "small",    "new",      "old",       "obvious",  "strange",  "useful",   "ambitious",
    "careful",  "simple",   "difficult", "surprising", "ordinary", "unusual", "early",
    "good",     "bad",      "hard",      "rare",     "common",   "quiet",    "honest",
    "clever",   "patient",  "young",     "famous",   "modest",   "important", "valuable",
    "fragile",  "practical", "boring",   "elegant",  "risky",    "cheap",    "expensive",
    "slow",     "fast"};

constexpr std::string_view kEssayAdverbs[] = {
    "usually",  "rarely",   "often",    "quietly",      "eventually", "gradually",
    "suddenly", "slowly",   "carefully", "deliberately", "sometimes", "seldom"};

constexpr std::string_view kEssayPhrases[] = {
    "in the early years",  "at a small company",   "after a few months",
    "before anyone notices", "for a long time",    "in most cities",
    "during the first year", "without much effort", "with surprising speed",
    "in a crowded market", "at the start",          "by the end of the year",
    "in every field",      "on a tight budget",     "under pressure"};

constexpr std::string_view kEssayConnectives[] = {
    "In practice",   "Of course",      "Most of the time", "As a rule",  "In the end",
    "For example",   "Surprisingly",   "Even so",          "At first",   "Over time",
    "In my experience", "Historically", "Oddly enough",    "Sooner or later"};

constexpr std::string_view kEssayJudgements[] = {
    "surprising", "remarkable", "strange", "worth noticing", "easy to forget"};

bool ends_with(std::string_view word, std::string_view suffix) {
  return word.size() >= suffix.size() && word.substr(word.size() - suffix.size()) == suffix;
}

bool is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// Regular English inflection: -s, -es after sibilants, -ies after a consonant + y.
std::string add_s(std::string_view word) {
  std::string out(word);
  if (ends_with(word, "s") || ends_with(word, "sh") || ends_with(word, "ch") ||
      ends_with(word, "x") || ends_with(word, "z")) {
    out += "es";
  } else if (word.size() >= 2 && word.back() == 'y' && !is_vowel(word[word.size() - 2])) {
    out.back() = 'i';
    out += "es";
  } else {
    out += "s";
  }
  return out;
}
std::string plural(std::string_view noun) { return add_s(noun); }
std::string third_person(std::string_view verb) { return add_s(verb); }

// "a" or "an" by the sound of the next word, for this vocabulary.
std::string_view indefinite_article(std::string_view next) {
  if (next.starts_with("us") || next.starts_with("uni")) return "a";  // "a useful", "a user"
  if (next.starts_with("hon")) return "an";                             // "an honest"
  return is_vowel(next.front()) ? "an" : "a";
}

std::string capitalized(std::string text) {
  if (!text.empty() && text[0] >= 'a' && text[0] <= 'z') text[0] = char(text[0] - 'a' + 'A');
  return text;
}

class EssayWriter {
 public:
  explicit EssayWriter(Generator& gen) : draws_(gen) {}

  std::string sentence() {
    switch (draws_.below(10)) {
      case 0: return subject_clause() + optional_phrase() + ".";
      case 1:
        return std::string(draws_.pick(kEssayConnectives)) + ", " + subject_clause() + ".";
      case 2:
        return "It is " + std::string(draws_.pick(kEssayJudgements)) + " how " +
               std::string(draws_.pick(kEssayAdverbs)) + " " + plural_phrase(kEssayPeople) +
               " " + std::string(draws_.pick(kEssayVerbs)) + " " + object() + ".";
      case 3:
        return "If you want to " + std::string(draws_.pick(kEssayVerbs)) + " " + object() +
               ", you have to " + std::string(draws_.pick(kEssayVerbs)) + " " + object() +
               " first.";
      case 4: return subject_clause() + " because " + subject_clause() + ".";
      case 5: {
        std::string_view first = draws_.pick(kEssayAdjectives), second;
        do second = draws_.pick(kEssayAdjectives);
        while (second == first);
        return "The " + std::string(draws_.pick(kEssayThings)) + " is not " +
               std::string(first) + " but " + std::string(second) + ".";
      }
      case 6:
        return "Most " + plural(draws_.pick(kEssayPeople)) + " " +
               std::string(draws_.pick(kEssayAdverbs)) + " " +
               std::string(draws_.pick(kEssayVerbs)) + " " + object() + ".";
      case 7:
        return "That is why " + plural_phrase(kEssayPeople) + " " +
               std::string(draws_.pick(kEssayVerbs)) + " " + object() + optional_phrase() + ".";
      case 8:
        return "What matters is whether " + singular_phrase(kEssayPeople) + " can " +
               std::string(draws_.pick(kEssayVerbs)) + " " + object() + ".";
      default:
        return capitalized(plural(draws_.pick(kEssayPeople))) + " who " +
               std::string(draws_.pick(kEssayVerbs)) + " " + object() + " tend to " +
               std::string(draws_.pick(kEssayVerbs)) + " " + object() + ".";
    }
  }

 private:
  // "[Subject] [verb agreeing with it] [object]", capitalised when it opens the sentence.
  std::string subject_clause() {
    bool people = draws_.below(3) != 0;
    if (draws_.below(2) == 0) {
      std::string subject = people ? singular_phrase(kEssayPeople) : singular_phrase(kEssayThings);
      return subject + " " + third_person(draws_.pick(kEssayVerbs)) + " " + object();
    }
    std::string subject = people ? plural_phrase(kEssayPeople) : plural_phrase(kEssayThings);
    return subject + " " + std::string(draws_.pick(kEssayVerbs)) + " " + object();
  }
  template <size_t N>
  std::string singular_phrase(const std::string_view (&nouns)[N]) {
    std::string noun = optional_adjective() + std::string(draws_.pick(nouns));
    switch (draws_.below(4)) {
      case 0: return "the " + noun;
      case 1: return "every " + noun;
      case 2: return "this " + noun;
      default: return std::string(indefinite_article(noun)) + " " + noun;
    }
  }
  template <size_t N>
  std::string plural_phrase(const std::string_view (&nouns)[N]) {
    static constexpr std::string_view kQuantifiers[] = {"the", "most", "many", "some", "few"};
    return std::string(draws_.pick(kQuantifiers)) + " " + optional_adjective() +
           plural(draws_.pick(nouns));
  }
  std::string object() {
    return draws_.below(3) == 0 ? plural_phrase(kEssayThings) : singular_phrase(kEssayThings);
  }
  std::string optional_adjective() {
    return draws_.below(2) == 0 ? std::string(draws_.pick(kEssayAdjectives)) + " " : "";
  }
  std::string optional_phrase() {
    std::string phrase;
    if (draws_.below(2) == 0) (phrase += ' ') += draws_.pick(kEssayPhrases);
    return phrase;
  }

  Draws draws_;
};

// The sentence starts are lowercase inside the clauses; the writer capitalises at the end.
std::string essay_sentence(EssayWriter& writer) { return capitalized(writer.sentence()); }

// ---- NIAH pieces -------------------------------------------------------------------------

constexpr std::string_view kNoiseParagraph =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
    "again.";

std::string random_number_string(Draws& draws) {
  return std::to_string(1000000 + draws.below(9000000));  // exactly 7 digits
}

std::string random_word_pair(Draws& draws) {
  return std::string(draws.pick(kKeyAdjectives)) + "-" + std::string(draws.pick(kKeyNouns));
}

std::string random_uuid(Draws& draws) {
  PhiloxBlock b = draws.block();
  uint8_t bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = uint8_t(b.word[i / 4] >> (8 * (3 - i % 4)));
  bytes[6] = uint8_t((bytes[6] & 0x0F) | 0x40);  // version 4
  bytes[8] = uint8_t((bytes[8] & 0x3F) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 0xF];
  }
  return out;
}

std::string random_of_type(NiahValueType type, Draws& draws) {
  switch (type) {
    case NiahValueType::Numbers: return random_number_string(draws);
    case NiahValueType::Words: return random_word_pair(draws);
    case NiahValueType::Uuids: return random_uuid(draws);
  }
  HAM_FAIL("NiahConfig: unknown value type");
}

// A value of `type` that is not in `used` (and is then added to it).
std::string fresh_of_type(NiahValueType type, Draws& draws,
                          std::unordered_set<std::string>& used) {
  for (;;) {
    std::string candidate = random_of_type(type, draws);
    if (used.insert(candidate).second) return candidate;
  }
}

// Everything about an example that does not depend on how much haystack it gets.
struct NiahPlan {
  std::vector<std::string> keys;
  std::vector<std::vector<std::string>> values;  // per key
  std::vector<std::string> needles;              // in order of appearance
  std::vector<std::string> queried_keys, expected;
  std::string instructions, question;
  uint64_t haystack_seed = 0, placement_seed = 0;
  std::unordered_set<std::string> used;  // keys and values of the real needles
};

std::string join_queries(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return keys[0];
  std::string out;
  for (size_t i = 0; i + 1 < keys.size(); ++i) out += keys[i] + ", ";
  return out + "and " + keys.back();
}

NiahPlan plan_niah(const NiahConfig& config) {
  Generator gen(config.seed);
  Draws draws(gen);
  NiahPlan plan;
  for (int64_t k = 0; k < config.num_keys; ++k) {
    plan.keys.push_back(fresh_of_type(config.key_type, draws, plan.used));
    plan.values.emplace_back();
    for (int64_t v = 0; v < config.num_values; ++v) {
      plan.values.back().push_back(fresh_of_type(config.value_type, draws, plan.used));
      plan.needles.push_back(niah_needle(config.value_type, plan.keys.back(),
                                         plan.values.back().back()));
    }
  }
  // Needles appear in random order, so a key's values are not always adjacent.
  std::vector<int64_t> order(plan.needles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  shuffle(order, gen);
  std::vector<std::string> shuffled;
  for (int64_t i : order) shuffled.push_back(plan.needles[size_t(i)]);
  plan.needles = std::move(shuffled);

  for (int64_t k : sample_distinct(0, config.num_keys, config.num_queries, draws)) {
    plan.queried_keys.push_back(plan.keys[size_t(k)]);
    for (const auto& value : plan.values[size_t(k)]) plan.expected.push_back(value);
  }
  plan.haystack_seed = draws.bits64();
  plan.placement_seed = draws.bits64();

  std::string plural_type(niah_value_type_name(config.value_type));
  std::string query = join_queries(plan.queried_keys);
  if (plan.expected.size() == 1) {
    std::string type = plural_type.substr(0, plural_type.size() - 1);
    plan.instructions = "A special magic " + type +
                        " is hidden within the following text. Make sure to memorize it. "
                        "I will quiz you about the " + type + " afterwards.";
    plan.question = "What is the special magic " + type + " for " + query +
                    " mentioned in the provided text? The special magic " + type + " for " +
                    query + " mentioned in the provided text is";
  } else {
    plan.instructions = "Some special magic " + plural_type +
                        " are hidden within the following text. Make sure to memorize them. "
                        "I will quiz you about the " + plural_type + " afterwards.";
    plan.question = "What are all the special magic " + plural_type + " for " + query +
                    " mentioned in the provided text? The special magic " + plural_type +
                    " for " + query + " mentioned in the provided text are";
  }
  return plan;
}

// Haystack units generated on demand from their own stream, so the first n units are the
// same whatever n the length search tries.
class Haystack {
 public:
  Haystack(const NiahConfig& config, const NiahPlan& plan)
      : config_(config), plan_(plan), gen_(plan.haystack_seed), essay_(gen_) {}

  std::string_view separator() const {
    return config_.haystack == NiahHaystack::Essay ? " " : "\n";
  }
  const std::string& unit(int64_t i) {
    while (int64_t(units_.size()) <= i) units_.push_back(next_unit());
    return units_[size_t(i)];
  }

 private:
  std::string next_unit() {
    switch (config_.haystack) {
      case NiahHaystack::Noise: return std::string(kNoiseParagraph);
      case NiahHaystack::Essay: return essay_sentence(essay_);
      case NiahHaystack::Needle: {
        // A distractor never reuses a real key or value, so it cannot answer the question.
        Draws draws(gen_);
        std::string key, value;
        do key = random_of_type(config_.key_type, draws);
        while (plan_.used.count(key));
        do value = random_of_type(config_.value_type, draws);
        while (plan_.used.count(value));
        return niah_needle(config_.value_type, key, value);
      }
    }
    HAM_FAIL("NiahConfig: unknown haystack");
  }

  const NiahConfig& config_;
  const NiahPlan& plan_;
  Generator gen_;
  EssayWriter essay_;
  std::vector<std::string> units_;
};

NiahExample assemble_niah(const NiahConfig& config, const NiahPlan& plan, Haystack& haystack,
                          int64_t units) {
  // Needle i goes before haystack unit boundary[i] (units = after the last one).
  std::vector<int64_t> boundary(plan.needles.size());
  if (config.depth >= 0) {
    std::fill(boundary.begin(), boundary.end(),
              int64_t(std::llround(config.depth * double(units))));
  } else {
    Generator gen(plan.placement_seed);
    Draws draws(gen);
    for (auto& b : boundary) b = int64_t(draws.below(uint64_t(units + 1)));
    std::sort(boundary.begin(), boundary.end());
  }
  NiahExample ex;
  ex.prompt = plan.instructions + "\n";
  std::string_view separator = haystack.separator();
  size_t context_start = ex.prompt.size();
  bool first_piece = true;
  auto append_piece = [&](std::string_view piece) {
    if (!first_piece) ex.prompt += separator;
    first_piece = false;
    ex.prompt += piece;
  };
  size_t next_needle = 0;
  for (int64_t u = 0; u <= units; ++u) {
    while (next_needle < boundary.size() && boundary[next_needle] == u) {
      append_piece("");  // separator only
      ex.needle_offsets.push_back(ex.prompt.size());
      ex.prompt += plan.needles[next_needle++];
    }
    if (u < units) append_piece(haystack.unit(u));
  }
  ex.context = ex.prompt.substr(context_start);
  ex.prompt += "\n" + plan.question;
  ex.question = plan.question;
  ex.expected = plan.expected;
  ex.queried_keys = plan.queried_keys;
  ex.keys = plan.keys;
  ex.needles = plan.needles;
  ex.haystack_units = units;
  return ex;
}

template <class Values>
Tensor rows_tensor(const Values& values, int64_t rows, int64_t seq_len) {
  return Tensor::from_vector(values, {rows, seq_len});
}

std::vector<int64_t> repeated_positions(int64_t rows, int64_t seq_len) {
  std::vector<int64_t> out(size_t(rows * seq_len));
  for (size_t i = 0; i < out.size(); ++i) out[i] = int64_t(i) % seq_len;
  return out;
}

}  // namespace

// ---- MQAR --------------------------------------------------------------------------------

void MqarConfig::validate() const {
  HAM_CHECK(seq_len >= 1, "MqarConfig.seq_len: must be >= 1, got ", seq_len);
  HAM_CHECK(num_pairs >= 1, "MqarConfig.num_pairs: must be >= 1, got ", num_pairs);
  HAM_CHECK(num_pairs <= seq_len / 4, "MqarConfig.num_pairs: 4 * num_pairs = ", 4 * num_pairs,
            " exceeds seq_len = ", seq_len, " (MQAR needs 4N <= T)");
  int64_t keys_available = vocab_size / 2 - 1, values_available = vocab_size - vocab_size / 2;
  HAM_CHECK(keys_available >= num_pairs && values_available >= num_pairs,
            "MqarConfig.vocab_size: ", vocab_size, " gives ", keys_available,
            " keys in [1, V/2) and ", values_available,
            " values in [V/2, V), fewer than num_pairs = ", num_pairs);
  HAM_CHECK(std::isfinite(power_a) && power_a > 0, "MqarConfig.power_a: must be > 0, got ",
            power_a);
}

MqarExample mqar_example(const MqarConfig& config, int64_t index) {
  config.validate();
  HAM_CHECK(index >= 0 && index < (int64_t(1) << 32), "mqar_example: index ", index,
            " is outside [0, 2^32)");
  Generator gen;
  gen.set_state(config.seed, uint64_t(index) << 32);
  Draws draws(gen);
  const int64_t T = config.seq_len, N = config.num_pairs, V = config.vocab_size;
  std::vector<int64_t> keys = sample_distinct(1, V / 2, N, draws);
  std::vector<int64_t> values = sample_distinct(V / 2, V, N, draws);

  MqarExample ex;
  ex.inputs.assign(size_t(T), 0);
  ex.targets.assign(size_t(T), kSyntheticIgnoreIndex);
  for (int64_t i = 0; i < N; ++i) {
    ex.inputs[size_t(2 * i)] = keys[size_t(i)];
    ex.inputs[size_t(2 * i + 1)] = values[size_t(i)];
  }
  // Gaps without replacement, P(gap g-1) proportional to g^(a-1): Efraimidis-Spirakis keys
  // log(u) / w give the same distribution as drawing one at a time and renormalising.
  const int64_t space = (T - 2 * N) / 2;
  std::vector<std::pair<double, int64_t>> scored(static_cast<size_t>(space));
  for (int64_t g = 0; g < space; ++g) {
    double weight = std::pow(double(g + 1), config.power_a - 1);
    scored[size_t(g)] = {std::log(draws.unit_open_at_zero()) / weight, g};
  }
  std::partial_sort(scored.begin(), scored.begin() + N, scored.end(),
                    [](const auto& a, const auto& b) {
                      return a.first != b.first ? a.first > b.first : a.second < b.second;
                    });
  std::vector<bool> is_query(size_t(T), false);
  for (int64_t i = 0; i < N; ++i) {
    int64_t position = 2 * N + 2 * scored[size_t(i)].second;
    ex.inputs[size_t(position)] = keys[size_t(i)];
    ex.targets[size_t(position)] = values[size_t(i)];
    is_query[size_t(position)] = true;
    ex.query_positions.push_back(position);
  }
  std::sort(ex.query_positions.begin(), ex.query_positions.end());
  if (config.random_non_queries) {
    for (int64_t t = 2 * N; t < T; ++t) {
      if (!is_query[size_t(t)]) ex.inputs[size_t(t)] = int64_t(draws.below(uint64_t(V)));
    }
  }
  return ex;
}

TokenBatch mqar_batch(const MqarConfig& config, int64_t first_index, int64_t batch_size) {
  HAM_CHECK(batch_size >= 1, "mqar_batch: batch_size must be >= 1, got ", batch_size);
  const int64_t T = config.seq_len;
  std::vector<int64_t> inputs, targets;
  for (int64_t b = 0; b < batch_size; ++b) {
    MqarExample ex = mqar_example(config, first_index + b);
    inputs.insert(inputs.end(), ex.inputs.begin(), ex.inputs.end());
    targets.insert(targets.end(), ex.targets.begin(), ex.targets.end());
  }
  return {rows_tensor(inputs, batch_size, T), rows_tensor(targets, batch_size, T),
          Tensor::zeros({batch_size, T}, DType::I64),
          rows_tensor(repeated_positions(batch_size, T), batch_size, T)};
}

// ---- NIAH --------------------------------------------------------------------------------

std::string_view niah_kind_name(NiahKind kind) {
  switch (kind) {
    case NiahKind::Single1: return "single_1";
    case NiahKind::Single2: return "single_2";
    case NiahKind::Single3: return "single_3";
    case NiahKind::MultiKey1: return "multikey_1";
    case NiahKind::MultiKey2: return "multikey_2";
    case NiahKind::MultiKey3: return "multikey_3";
    case NiahKind::MultiValue: return "multivalue";
    case NiahKind::MultiQuery: return "multiquery";
  }
  return "unknown";
}

const std::vector<NiahKind>& all_niah_kinds() {
  static const std::vector<NiahKind> kinds = {
      NiahKind::Single1,   NiahKind::Single2,   NiahKind::Single3,    NiahKind::MultiKey1,
      NiahKind::MultiKey2, NiahKind::MultiKey3, NiahKind::MultiValue, NiahKind::MultiQuery};
  return kinds;
}

NiahKind niah_kind_from_name(std::string_view name) {
  std::string_view bare = name.starts_with("niah_") ? name.substr(5) : name;
  std::string known;
  for (NiahKind kind : all_niah_kinds()) {
    if (bare == niah_kind_name(kind)) return kind;
    known += (known.empty() ? "" : ", ") + std::string(niah_kind_name(kind));
  }
  HAM_FAIL("NIAH task '", name, "' is unknown (known: ", known, ")");
}

std::string_view niah_value_type_name(NiahValueType type) {
  switch (type) {
    case NiahValueType::Numbers: return "numbers";
    case NiahValueType::Words: return "words";
    case NiahValueType::Uuids: return "uuids";
  }
  return "unknown";
}

int64_t count_bytes(std::string_view text) { return int64_t(text.size()); }

NiahConfig NiahConfig::preset(NiahKind kind, int64_t context_tokens, uint64_t seed) {
  NiahConfig c;
  c.context_tokens = context_tokens;
  c.seed = seed;
  c.haystack = NiahHaystack::Essay;  // most of the family
  switch (kind) {
    case NiahKind::Single1: c.haystack = NiahHaystack::Noise; break;
    case NiahKind::Single2: break;
    case NiahKind::Single3: c.value_type = NiahValueType::Uuids; break;
    case NiahKind::MultiKey1: c.num_keys = 4; break;
    case NiahKind::MultiKey2: c.haystack = NiahHaystack::Needle; break;
    case NiahKind::MultiKey3:
      c.haystack = NiahHaystack::Needle;
      c.key_type = NiahValueType::Uuids;
      c.value_type = NiahValueType::Uuids;
      break;
    case NiahKind::MultiValue: c.num_values = 4; break;
    case NiahKind::MultiQuery:
      c.num_keys = 4;
      c.num_queries = 4;
      break;
  }
  return c;
}

void NiahConfig::validate() const {
  HAM_CHECK(num_keys >= 1, "NiahConfig.num_keys: must be >= 1, got ", num_keys);
  HAM_CHECK(num_values >= 1, "NiahConfig.num_values: must be >= 1, got ", num_values);
  HAM_CHECK(num_queries >= 1 && num_queries <= num_keys,
            "NiahConfig.num_queries: must be in [1, num_keys = ", num_keys, "], got ",
            num_queries);
  // Keys and values are distinct strings; the smallest pool (word pairs) must hold them
  // with room to spare so that rejection stays fast.
  HAM_CHECK(num_keys * (1 + num_values) <= 1000,
            "NiahConfig.num_keys: num_keys * (1 + num_values) = ", num_keys * (1 + num_values),
            " needles exceed the limit of 1000");
  HAM_CHECK(context_tokens >= 1, "NiahConfig.context_tokens: must be >= 1, got ",
            context_tokens);
  HAM_CHECK(depth <= 1 && !std::isnan(depth),
            "NiahConfig.depth: must be a fraction in [0, 1] (or negative for random), got ",
            depth);
}

std::string niah_needle(NiahValueType value_type, std::string_view key, std::string_view value) {
  return "One of the special magic " + std::string(niah_value_type_name(value_type)) + " for " +
         std::string(key) + " is: " + std::string(value) + ".";
}

NiahExample make_niah_example(const NiahConfig& config, const TokenCounter& counter) {
  config.validate();
  NiahPlan plan = plan_niah(config);
  Haystack haystack(config, plan);
  auto tokens_with = [&](int64_t units) {
    return counter(assemble_niah(config, plan, haystack, units).prompt);
  };
  const int64_t target = config.context_tokens;
  int64_t bare = tokens_with(0);
  HAM_CHECK(bare <= target, "NiahConfig.context_tokens: ", target,
            " is too small: the instructions, needles and question alone take ", bare,
            " tokens");
  // The largest unit count that fits: guess from one unit's cost, grow until it does not
  // fit, then bisect (token counts grow with the unit count, so this brackets it).
  int64_t per_unit = std::max<int64_t>(1, tokens_with(1) - bare);
  int64_t fits = 0, too_many = -1;
  int64_t probe = std::max<int64_t>(1, (target - bare) / per_unit);
  while (too_many < 0) {
    if (tokens_with(probe) <= target) {
      fits = probe;
      probe += std::max<int64_t>(1, probe / 8);
    } else {
      too_many = probe;
    }
  }
  while (too_many - fits > 1) {
    int64_t middle = fits + (too_many - fits) / 2;
    (tokens_with(middle) <= target ? fits : too_many) = middle;
  }
  NiahExample ex = assemble_niah(config, plan, haystack, fits);
  ex.tokens = counter(ex.prompt);
  return ex;
}

double ruler_score(const std::string& output, const std::vector<std::string>& expected) {
  HAM_CHECK(!expected.empty(), "ruler_score: the list of expected answers is empty");
  auto lowered = [](std::string text) {
    for (char& c : text) {
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    }
    return text;
  };
  std::string haystack = lowered(output);
  int64_t found = 0;
  for (const auto& answer : expected) {
    if (haystack.find(lowered(answer)) != std::string::npos) ++found;
  }
  return double(found) / double(expected.size());
}

std::string generate_essay(int64_t sentences, Generator& gen) {
  HAM_CHECK(sentences >= 0, "generate_essay: sentences must be >= 0, got ", sentences);
  EssayWriter writer(gen);
  std::string out;
  for (int64_t i = 0; i < sentences; ++i) {
    if (i > 0) out += ' ';
    out += essay_sentence(writer);
  }
  return out;
}

// ---- Mixtures ------------------------------------------------------------------------------

MixtureSource text_source(const TokenStream& stream, double weight, std::string name) {
  return {std::move(name), weight, [&stream](int64_t rows, int64_t seq_len, Generator& gen) {
            return stream.sample(rows, seq_len, gen);
          }};
}

MixtureSource mqar_source(MqarConfig config, double weight, std::string name) {
  return {std::move(name), weight, [config](int64_t rows, int64_t seq_len, Generator& gen) {
            MqarConfig at_length = config;
            at_length.seq_len = seq_len;
            std::vector<int64_t> inputs, targets;
            Draws draws(gen);
            for (int64_t r = 0; r < rows; ++r) {
              at_length.seed = draws.bits64();  // every row its own dataset draw
              MqarExample ex = mqar_example(at_length, 0);
              inputs.insert(inputs.end(), ex.inputs.begin(), ex.inputs.end());
              targets.insert(targets.end(), ex.targets.begin(), ex.targets.end());
            }
            return TokenBatch{rows_tensor(inputs, rows, seq_len),
                              rows_tensor(targets, rows, seq_len), Tensor(), Tensor()};
          }};
}

MixtureSource niah_source(NiahConfig config, TextEncoder encode, int64_t pad_token,
                          double weight, std::string name) {
  return {std::move(name), weight,
          [config, encode = std::move(encode), pad_token](int64_t rows, int64_t seq_len,
                                                          Generator& gen) {
            TokenCounter counter = [&encode](std::string_view text) {
              return int64_t(encode(text).size());
            };
            Draws draws(gen);
            std::vector<int64_t> inputs(size_t(rows * seq_len), pad_token);
            std::vector<int64_t> targets(size_t(rows * seq_len), kSyntheticIgnoreIndex);
            for (int64_t r = 0; r < rows; ++r) {
              NiahConfig row_config = config;
              row_config.seed = draws.bits64();
              // The row holds seq_len + 1 tokens (inputs plus the last target). The answer
              // depends only on the seed, so one retry shrinks the haystack by its length.
              row_config.context_tokens = seq_len + 1;
              std::vector<int64_t> sequence;
              size_t prompt_length = 0;
              for (int attempt = 0; attempt < 3; ++attempt) {
                HAM_CHECK(row_config.context_tokens >= 1, "niah_source: seq_len ", seq_len,
                          " is too short for a NIAH example and its answer");
                NiahExample ex;
                try {
                  ex = make_niah_example(row_config, counter);
                } catch (const Error& e) {
                  HAM_FAIL("niah_source (seq_len ", seq_len, "): ", e.what());
                }
                std::string answer = " ";
                for (size_t i = 0; i < ex.expected.size(); ++i) {
                  answer += (i ? ", " : "") + ex.expected[i];
                }
                answer += ".";
                sequence = encode(ex.prompt);
                prompt_length = sequence.size();
                std::vector<int64_t> answer_ids = encode(answer);
                sequence.insert(sequence.end(), answer_ids.begin(), answer_ids.end());
                int64_t overflow = int64_t(sequence.size()) - (seq_len + 1);
                if (overflow <= 0) break;
                row_config.context_tokens -= overflow;
              }
              HAM_CHECK(int64_t(sequence.size()) <= seq_len + 1, "niah_source: seq_len ",
                        seq_len, " is too short for a NIAH example and its answer");
              for (size_t t = 0; t + 1 < sequence.size(); ++t) {
                size_t i = size_t(r * seq_len) + t;
                inputs[i] = sequence[t];
                // Loss only where the next token is part of the answer.
                if (t + 1 >= prompt_length) targets[i] = sequence[t + 1];
              }
            }
            return TokenBatch{rows_tensor(inputs, rows, seq_len),
                              rows_tensor(targets, rows, seq_len), Tensor(), Tensor()};
          }};
}

BatchMixture::BatchMixture(std::vector<MixtureSource> sources, uint64_t seed)
    : sources_(std::move(sources)), gen_(seed) {
  HAM_CHECK(!sources_.empty(), "BatchMixture: no sources");
  double total = 0;
  for (const auto& source : sources_) {
    HAM_CHECK(std::isfinite(source.weight) && source.weight >= 0, "BatchMixture: source '",
              source.name, "' has weight ", source.weight, "; weights must be finite and >= 0");
    HAM_CHECK(bool(source.sample), "BatchMixture: source '", source.name,
              "' has no sample function");
    total += source.weight;
  }
  HAM_CHECK(total > 0, "BatchMixture: the source weights sum to 0");
}

TokenBatch BatchMixture::sample(int64_t batch, int64_t seq_len, Generator& gen) {
  HAM_CHECK(batch >= 1 && seq_len >= 1, "BatchMixture::sample: batch and seq_len must be >= 1, "
            "got ", batch, " and ", seq_len);
  double total = 0;
  for (const auto& source : sources_) total += source.weight;
  Draws draws(gen);
  last_row_sources_.assign(size_t(batch), 0);
  std::vector<std::vector<int64_t>> rows_of(sources_.size());
  for (int64_t r = 0; r < batch; ++r) {
    double u = draws.unit() * total;
    size_t chosen = 0;
    // The last source with a positive weight takes any rounding at the top end.
    for (size_t s = 0; s < sources_.size(); ++s) {
      if (sources_[s].weight <= 0) continue;
      chosen = s;
      if (u < sources_[s].weight) break;
      u -= sources_[s].weight;
    }
    last_row_sources_[size_t(r)] = int64_t(chosen);
    rows_of[chosen].push_back(r);
  }
  const size_t row_size = size_t(seq_len);
  std::vector<int64_t> inputs(size_t(batch) * row_size), targets(inputs.size());
  std::vector<int64_t> doc_ids(inputs.size(), 0), positions = repeated_positions(batch, seq_len);
  for (size_t s = 0; s < sources_.size(); ++s) {
    const auto& rows = rows_of[s];
    if (rows.empty()) continue;
    int64_t k = int64_t(rows.size());
    TokenBatch part = sources_[s].sample(k, seq_len, gen);
    HAM_CHECK(part.inputs.defined() && part.targets.defined() &&
                  part.inputs.shape() == Shape({k, seq_len}) &&
                  part.targets.shape() == Shape({k, seq_len}),
              "BatchMixture: source '", sources_[s].name,
              "' returned inputs/targets that are not [", k, ", ", seq_len, "]");
    auto scatter = [&](const Tensor& from, std::vector<int64_t>& to) {
      std::vector<int64_t> values = from.to_vector<int64_t>();
      for (int64_t i = 0; i < k; ++i) {
        std::copy_n(values.begin() + i * seq_len, seq_len,
                    to.begin() + rows[size_t(i)] * seq_len);
      }
    };
    scatter(part.inputs, inputs);
    scatter(part.targets, targets);
    if (part.doc_ids.defined()) scatter(part.doc_ids, doc_ids);
    if (part.positions.defined()) scatter(part.positions, positions);
  }
  return {rows_tensor(inputs, batch, seq_len), rows_tensor(targets, batch, seq_len),
          rows_tensor(doc_ids, batch, seq_len), rows_tensor(positions, batch, seq_len)};
}

// ---- NIAH token spans ----------------------------------------------------------------------

NiahTokenSpans niah_token_spans(const NiahExample& example, const TextEncoder& encode) {
  const std::string& prompt = example.prompt;
  // Layout (assemble_niah): instructions "\n" context "\n" question.
  HAM_CHECK(prompt.size() >= example.context.size() + example.question.size() + 2 &&
                prompt.ends_with(example.question),
            "niah_token_spans: the example's prompt does not end with its question");
  size_t question_start = prompt.size() - example.question.size();
  size_t context_end = question_start - 1;
  size_t context_start = context_end - example.context.size();
  HAM_CHECK(prompt.compare(context_start, example.context.size(), example.context) == 0,
            "niah_token_spans: the example's context is not where the prompt layout puts it");
  HAM_CHECK(example.needle_offsets.size() == example.needles.size(),
            "niah_token_spans: ", example.needles.size(), " needles but ",
            example.needle_offsets.size(), " needle offsets");
  auto tokens_before = [&](size_t byte) {
    return int64_t(encode(std::string_view(prompt).substr(0, byte)).size());
  };
  NiahTokenSpans spans;
  spans.instructions = {0, tokens_before(context_start > 0 ? context_start - 1 : 0)};
  spans.context = {tokens_before(context_start), tokens_before(context_end)};
  spans.question = {tokens_before(question_start), int64_t(encode(prompt).size())};
  for (size_t i = 0; i < example.needles.size(); ++i) {
    size_t start = example.needle_offsets[i];
    HAM_CHECK(start >= context_start && start + example.needles[i].size() <= context_end,
              "niah_token_spans: needle ", i, " at byte ", start, " lies outside the context");
    spans.needles.push_back({tokens_before(start), tokens_before(start + example.needles[i].size())});
  }
  return spans;
}

}  // namespace ham

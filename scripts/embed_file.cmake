# Turns INPUT into a C++ source defining ham::default_corpus() (bytes and size).
file(READ ${INPUT} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUTPUT} "// Generated from ${INPUT}; do not edit.\n#include <cstddef>\n#include <string_view>\n\nnamespace ham {\nnamespace {\nconst unsigned char kCorpus[] = {\n${bytes}0};\n}\nstd::string_view default_corpus() {\n  return {reinterpret_cast<const char*>(kCorpus), ${size}};\n}\n}  // namespace ham\n")

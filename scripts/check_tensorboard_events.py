#!/usr/bin/env python3
"""Checks that TensorBoard's own readers accept an event file written by ham.

usage: check_tensorboard_events.py EVENT_FILE [TAG=STEP:VALUE ...]

Reads the file twice: with EventFileLoader (the record reader TensorBoard uses, which
verifies the masked CRC-32C of every record) and with EventAccumulator (what the scalar
dashboard shows). Every TAG=STEP:VALUE given must appear in both. Exits 0 on success,
1 with a one-line reason otherwise.
"""
import math
import sys


def fail(message):
    print(f"check_tensorboard_events: {message}", file=sys.stderr)
    sys.exit(1)


def parse_expectations(arguments):
    expected = []
    for argument in arguments:
        try:
            tag, rest = argument.rsplit("=", 1)
            step, value = rest.split(":", 1)
            expected.append((tag, int(step), float(value)))
        except ValueError:
            fail(f"cannot parse expectation '{argument}' (want TAG=STEP:VALUE)")
    return expected


def scalar_of(value):
    """The float of a Summary.Value, before or after TensorBoard's data migration."""
    if value.HasField("simple_value"):
        return value.simple_value
    if value.HasField("tensor"):
        from tensorboard.util import tensor_util

        return float(tensor_util.make_ndarray(value.tensor).item())
    return None


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def main():
    if len(sys.argv) < 2:
        fail("usage: check_tensorboard_events.py EVENT_FILE [TAG=STEP:VALUE ...]")
    path = sys.argv[1]
    expected = parse_expectations(sys.argv[2:])

    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import event_file_loader

    # 1. The raw loader: every record's framing and CRCs must check out.
    events = list(event_file_loader.EventFileLoader(path).Load())
    if not events:
        fail(f"{path}: EventFileLoader read no events")
    if events[0].file_version != "brain.Event:2":
        fail(f"{path}: first event has file_version '{events[0].file_version}'")
    loaded = set()
    for event in events[1:]:
        for value in event.summary.value:
            number = scalar_of(value)
            if number is None:
                fail(f"{path}: value '{value.tag}' at step {event.step} holds no scalar")
            loaded.add((value.tag, event.step, number))
    for tag, step, number in expected:
        if not any(t == tag and s == step and close(v, number) for t, s, v in loaded):
            fail(f"{path}: EventFileLoader did not find {tag}={step}:{number} in {sorted(loaded)}")

    # 2. The accumulator behind the scalars dashboard.
    accumulator = event_accumulator.EventAccumulator(path, size_guidance={"scalars": 0})
    accumulator.Reload()
    tags = accumulator.Tags().get("scalars", [])
    for tag, step, number in expected:
        if tag not in tags:
            fail(f"{path}: EventAccumulator has no scalar tag '{tag}' (tags: {tags})")
        if not any(e.step == step and close(e.value, number) for e in accumulator.Scalars(tag)):
            fail(f"{path}: EventAccumulator did not find {tag}={step}:{number}")

    print(f"check_tensorboard_events: {path}: {len(events)} events, "
          f"{len(expected)} expected scalars found by EventFileLoader and EventAccumulator")


if __name__ == "__main__":
    main()

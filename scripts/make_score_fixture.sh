#!/usr/bin/env bash
# Regenerates fixtures/medium-features.csv (200 synthetic documents for rankers/medium.json, from
# rank::synth::synth_features with seed 2026) and fixtures/medium-scores.txt (their reference
# scores). Run after changing rankers/medium.json or the generator.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKSERVE_REGENERATE_FIXTURES=1 cargo test --test main cli::medium_fixture_scores_match_the_reference

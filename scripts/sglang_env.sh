#!/usr/bin/env bash
# Source me: the SGLang adapter environment (see conformance/adapters/sglang/env.sh).
# shellcheck disable=SC1091
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/conformance/adapters/sglang/env.sh"

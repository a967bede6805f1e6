"""`pdserve bench`: a serving benchmark that measures TTFT, TPOT, ITL, E2EL and goodput the way
`vllm bench serve` does, against a running pdserve gateway."""

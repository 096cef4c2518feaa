"""Model aliases: one name for several deployments, with fallback, load balancing and limits.

`deployment.py` (what a deployment is, its circuit breaker), `failures.py` (which
failures move a call on), `limits.py` and `redis_limits.py` (rate limits and calls in
flight, in this process or shared by replicas), `router.py` (the alias's client),
`metrics.py` (per deployment), `status.py` (what ListModels shows).
"""

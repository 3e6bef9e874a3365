"""What this project adds to verl's trainer, through its public hooks (and one version-gated patch).

- ``advantage``: the ``grpo_clipstd`` advantage estimator (verl's ``register_adv_est``).
- ``step_metrics``: one training step's reward components, rollout behaviour and masking check as metrics (numpy only).
- ``step_sampler``: verl's replay buffer plus those metrics (``trainer.v1.sampler.custom_sampler``).
- ``patches``: the reward and rollout columns of the training rollout dump (verl-version-gated).

Importing this package imports none of them: the plugin loads each where verl needs it.
"""

"""Proximal policy optimization with tf-agents, as MLGO trains its policies.

Each step compiles a batch of training modules with the policy sampling its decisions,
scores each module by the relative reduction of the problem's metric (.text, spill+reload
cost) against the default heuristic, and hands every decision to tf-agents' PPOClipAgent
with that module's reward (discount 0: each decision is credited with the outcome of the
compilation it was part of, MLGO's scheme). The actor network has exactly the numpy
policy's layers, so rollouts run in the compile workers without TensorFlow and the weights
move both ways unchanged. A per-candidate policy (regalloc) is one MLP scoring every slot,
the mask a last observation column that rules slots out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mlgo.corpus.compile import compile_module
from mlgo.corpus.format import Module
from mlgo.options import MOST_PER_STEP, positive
from mlgo.problems.policy import MASKED, MLPPolicy
from mlgo.runtime.files import atomic_directory
from mlgo.runtime.tfutil import import_quietly, import_tf
from mlgo.runtime.workers import Failed
from mlgo.train.loop import Candidate, Session, Step, Trainer, require_compiled
from mlgo.train.options import option
from mlgo.train.rollouts import scored_pool

REWARD_SCALE = 100.0  # rewards in percent of the default's cost: the scale PPO's defaults expect
REWARD_FLOOR = -1.0


@dataclass(frozen=True)
class PPOConfig:
    steps: int = 40
    batch: int = field(
        default=24, metadata=option("modules compiled per step", min=1, max=MOST_PER_STEP)
    )
    epochs: int = 4
    lr: float = 3e-4
    clip: float = 0.2
    entropy: float = 0.01
    eval_every: int = 5
    max_module_seconds: float = field(
        default=2.0,
        metadata=option("modules that compile slower stay out of training", check=positive),
    )
    seed: int = 0
    init: str = ""  # the --init run or policy, as given: its model card's starting point
    max_seconds: float = 0.0  # training time budget over all resumes (0: none)


@dataclass(frozen=True)
class RolloutTask:
    module: Module
    clang: str
    policy: MLPPolicy


def rollout_one(task: RolloutTask) -> dict:
    """One sampled compilation: the policy's raw input rows for every decision, its actions,
    and the module's cost."""
    problem = task.policy.problem
    run = compile_module(problem, task.module, task.clang, task.policy)
    x = task.policy.decision_rows(run.features, run.num_decisions)
    return {"x": x, "actions": run.advice, "cost": run.metrics[problem.reward_metric]}


def _candidate_actor(obs_spec, action_spec, hidden: tuple[int, ...]):
    """A tf-agents actor for per-slot observations: one MLP scores each slot."""
    tf = import_tf()
    import tensorflow_probability as tfp
    from tf_agents.networks import network
    from tf_agents.specs import distribution_spec, tensor_spec

    class CandidateActor(network.DistributionNetwork):
        def __init__(self) -> None:
            logits = tensor_spec.TensorSpec(obs_spec.shape[:1], tf.float32, "logits")
            output_spec = distribution_spec.DistributionSpec(
                tfp.distributions.Categorical,
                {"logits": logits},
                sample_spec=action_spec,
                dtype=action_spec.dtype,
            )
            super().__init__(obs_spec, (), output_spec, name="CandidateActor")
            self._dense = [tf.keras.layers.Dense(w, activation="relu") for w in hidden]
            self._dense.append(tf.keras.layers.Dense(1))

        def call(self, observations, step_type=None, network_state=(), training=False):
            h = observations[..., :-1]
            for layer in self._dense:
                h = layer(h)
            logits = tf.where(observations[..., -1] > 0, h[..., 0], MASKED)
            return self.output_spec.build_distribution(logits=logits), network_state

    return CandidateActor()


class Agent:
    """tf-agents' PPOClipAgent around an actor shaped exactly like the numpy policy."""

    def __init__(self, policy: MLPPolicy, cfg: PPOConfig):
        tf = import_tf()
        import_quietly("tf_agents")
        from tf_agents.agents.ppo import ppo_clip_agent
        from tf_agents.networks import actor_distribution_network, value_network
        from tf_agents.specs import tensor_spec
        from tf_agents.trajectories import time_step

        hidden = tuple(w.shape[1] for w in policy.weights[:-2:2])
        shape = policy.observation_shape
        self.obs_spec = tf.TensorSpec(shape, tf.float32, "observation")
        if len(shape) == 2:  # one row per slot: a scorer shared by the slots
            slots = shape[0]
            action_spec = tensor_spec.BoundedTensorSpec((), tf.int64, 0, slots - 1, "action")
            self.actor = _candidate_actor(self.obs_spec, action_spec, hidden)
        else:
            actions = policy.weights[-1].shape[0]
            action_spec = tensor_spec.BoundedTensorSpec((), tf.int64, 0, actions - 1, "action")
            self.actor = actor_distribution_network.ActorDistributionNetwork(
                self.obs_spec, action_spec, fc_layer_params=hidden
            )
        self.value = value_network.ValueNetwork(self.obs_spec, fc_layer_params=hidden)
        self.optimizer = tf.keras.optimizers.Adam(cfg.lr)
        self.agent = ppo_clip_agent.PPOClipAgent(
            time_step.time_step_spec(self.obs_spec),
            action_spec,
            optimizer=self.optimizer,
            actor_net=self.actor,
            value_net=self.value,
            importance_ratio_clipping=cfg.clip,
            entropy_regularization=cfg.entropy,
            num_epochs=cfg.epochs,
            discount_factor=0.0,
            use_gae=False,
            normalize_observations=False,
            normalize_rewards=False,
            compute_value_and_advantage_in_train=True,
            update_normalizers_in_train=False,
        )
        self.agent.initialize()
        self.set_policy(policy)
        self.checkpoint = tf.train.Checkpoint(
            actor=self.actor, value=self.value, optimizer=self.optimizer
        )

    def set_policy(self, policy: MLPPolicy) -> None:
        for var, w in zip(self.actor.trainable_variables, policy.weights, strict=True):
            var.assign(w)

    def weights(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.actor.trainable_variables]

    def train(
        self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, logits: np.ndarray
    ) -> float:
        """One PPO update; each decision is a one-step episode with its module's reward."""
        tf = import_tf()
        from tf_agents.trajectories import trajectory

        n = len(actions)

        def pair(a: np.ndarray) -> np.ndarray:  # [n, ...] -> [n, 2, ...]: step and boundary
            return np.repeat(a[:, None], 2, axis=1)

        experience = trajectory.Trajectory(
            step_type=tf.constant(np.tile([0, 2], (n, 1)), tf.int32),
            observation=tf.constant(pair(obs), tf.float32),
            action=tf.constant(pair(actions), tf.int64),
            policy_info={"dist_params": {"logits": tf.constant(pair(logits), tf.float32)}},
            next_step_type=tf.constant(np.tile([2, 0], (n, 1)), tf.int32),
            reward=tf.constant(pair(rewards), tf.float32),
            discount=tf.constant(np.zeros((n, 2)), tf.float32),
        )
        return float(self.agent.train(experience).loss)

    def save(self, directory: Path) -> None:
        with atomic_directory(directory) as staging:
            self.checkpoint.write(str(staging / "agent"))

    def restore(self, directory: Path) -> None:
        self.checkpoint.read(str(directory / "agent")).assert_existing_objects_matched()


class PPO(Trainer[PPOConfig]):
    """PPO as the module doc says; its checkpoint: the tf-agents agent, in OUT/agent."""

    name = "ppo"
    title = "PPO"
    Config = PPOConfig

    def resumable(self, root: Path) -> bool:
        return (root / "agent").exists()

    def start(
        self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
    ) -> float | None:
        self.init, self.clang, self.workers = init, run.tc.clang, run.workers
        self.scorer, self.pool = scored_pool(run, init.problem, self.config.max_module_seconds)
        self.agent = Agent(init, self.config)
        self.agent_dir = run.run_dir.root / "agent"
        if arrays is not None:
            self.agent.restore(self.agent_dir)
            return None
        return self.scorer.reward(init, self.pool)

    def step(self, run: Session) -> Step:
        cfg = self.config
        rng = np.random.default_rng(cfg.seed + run.state.step)
        batch = list(rng.choice(self.pool, min(cfg.batch, len(self.pool)), replace=False))
        current = replace(self.init, weights=self.agent.weights())
        seed = cfg.seed * 100003 + run.state.step * 1009
        tasks = [
            RolloutTask(m, self.clang, replace(current, temperature=1.0, seed=seed + i))
            for i, m in enumerate(batch)
        ]
        xs, acts, rews, sizes, failures = [], [], [], [], []
        for task, r in self.workers.imap(rollout_one, tasks):
            if isinstance(r, Failed):  # the module is left out of this step
                failures.append(r.message)
                continue
            base = self.scorer.base[task.module.name][self.scorer.metric]
            # A sampled compile can cost several times the default (regalloc: one batch
            # averaged -305%); floored at -100%, such modules cannot swamp the batch.
            reward = max((base - r["cost"]) / base, REWARD_FLOOR)
            sizes.append(reward)
            if len(r["actions"]):
                xs.append(r["x"])
                acts.append(r["actions"])
                rews.append(np.full(len(r["actions"]), reward * REWARD_SCALE))
        run.state.compiles += len(tasks)
        run.dropped(failures)
        require_compiled(len(sizes), len(tasks), "rollouts")
        metrics = {"ppo/batch_reward_mean": float(np.mean(sizes))}
        if xs:  # a batch whose modules asked nothing has nothing to learn from
            obs, logits = current.observations(np.concatenate(xs))
            acts_all, rews_all = np.concatenate(acts), np.concatenate(rews)
            metrics["ppo/loss"] = self.agent.train(obs, acts_all, rews_all, logits)
        self.agent.save(self.agent_dir)  # before scoring it: a skipped scoring keeps the update
        scored = None
        if run.due(cfg.eval_every):
            trained = replace(self.init, weights=self.agent.weights())
            scored = Candidate(trained, self.scorer.reward(trained, self.pool))
            metrics["ppo/pool_reward"] = scored.reward
        run.state.compiles += self.scorer.take_compiles()
        return Step(metrics, scored)

    def arrays(self) -> dict[str, np.ndarray]:
        return {}  # the agent is its own checkpoint, saved with each step


TRAINER = PPO

"""Runtime: sampling parameters and sampler, model runner, scheduler and the serving engine."""

from .sampling import Sample, SamplingParams

__all__ = ["Engine", "EngineConfig", "KVAllocation", "Sample", "SamplingParams", "StepOutput"]


def __getattr__(name: str):
    # the engine pulls in the model; import it only when asked for
    if name in ("Engine", "EngineConfig", "KVAllocation", "StepOutput", "EngineStats"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)

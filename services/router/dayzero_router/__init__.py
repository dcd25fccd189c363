"""dayzero router: routes requests to prefill and decode workers; hosts the stage planner."""

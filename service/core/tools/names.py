"""The names of the tools the service itself offers the model, beside those of tool files.

Agent files may not name these (the runner adds them where a stage needs them); the
demo model and the modes recognise calls by them.
"""

from __future__ import annotations

#: PLAN_EXECUTE's fixed planning tools: the planner's, a task's report, the replanner's
#: decision and the verifier's verdict.
PLAN_ADD_TASKS_TOOL = "_plan_add_tasks_"
PLAN_UPDATE_TASK_TOOL = "_plan_update_task_"
PLAN_DECIDE_TOOL = "_plan_decide_"
PLAN_VERIFY_TOOL = "_plan_verify_"
PLANNING_TOOLS = (PLAN_ADD_TASKS_TOOL, PLAN_UPDATE_TASK_TOOL, PLAN_DECIDE_TOOL, PLAN_VERIFY_TOOL)
#: The tool a REACT agent with `react.escalate` calls to switch to PLAN_EXECUTE.
PLAN_CREATE_TOOL = "plan_create"
#: The tool of the call that summarises a chat's oldest turns (the context window).
CONTEXT_SUMMARY_TOOL = "_context_summary_"
#: The tool that loads a skill's text, offered to the stages of agents with `skills`.
SKILL_TOOL = "skill"
#: Every name above: a tool the client declares may not take one.
SERVICE_TOOLS = frozenset({*PLANNING_TOOLS, PLAN_CREATE_TOOL, CONTEXT_SUMMARY_TOOL, SKILL_TOOL})

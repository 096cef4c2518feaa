// The plan of a run and its tasks, live: methods mixed into RunView (see render.js).
// The plan card also holds the calls of the plan's own tools (one folded line each).

import { h } from './dom.js';

const STATUS_LABEL = {
  TASK_STATUS_INIT: 'planned',
  TASK_STATUS_IN_PROGRESS: 'running',
  TASK_STATUS_COMPLETED: 'done',
  TASK_STATUS_FAILED: 'failed',
  TASK_STATUS_CANCELED: 'dropped',
};

export const planHandlers = {
  showPlan(ev, plan) {
    if (!this.plan) {
      this.plan = { list: h('ol'), items: new Map(), calls: h('div', { class: 'plan-calls' }) };
      this.plan.el = h('div', { class: 'card plan' },
        h('div', { class: 'card-title' }, 'Plan'), this.plan.list, this.plan.calls);
      this.body.prepend(this.plan.el);
    }
    if (ev.planId) this.plan.el.dataset.planId = ev.planId;
    for (const task of plan?.tasks || []) this.setTask(task.taskId, task.status, task.description);
  },

  /** Where the calls of the plan's own tools go: inside the plan card (made, still
   *  empty, when the planner's call comes before the plan). */
  planCalls(ev) {
    this.showPlan(ev, null);
    return this.plan.calls;
  },

  setTask(taskId, status, description) {
    let item = this.plan?.items.get(taskId);
    if (!this.plan) return;
    if (!item) {
      item = h('li', { 'data-task-id': taskId });
      this.plan.items.set(taskId, item);
      this.plan.list.append(item);
    }
    if (description) item.textContent = description;
    if (status) {
      item.dataset.status = status;
      item.dataset.label = STATUS_LABEL[status] || status;
    }
  },

  on_plan_create(ev) { this.showPlan(ev, ev.plan); },
  on_plan_update(ev) { this.showPlan(ev, ev.plan); },
  on_plan_revise(ev) {
    this.showPlan(ev, ev.plan);
    this.plan.el.append(h('div', { class: 'note' },
      `${(ev.decision || '').replace('PLAN_DECISION_', '').toLowerCase()}: ${ev.reason || ''}`));
  },
  on_plan_approval(ev) {
    this.showPlan(ev, ev.plan);
    this.askButtons(ev, ev.approvalId, 'Approve this plan?', [
      ['Approve', { approved: true }], ['Reject', { approved: false }]]);
    this.waiting(ev.approvalId, true);
  },
  on_task_start(ev) {
    this.setTask(ev.taskId, 'TASK_STATUS_IN_PROGRESS', ev.description);
    this.place(ev);
  },
  on_task_complete(ev) { this.setTask(ev.taskId, 'TASK_STATUS_COMPLETED'); },
  on_task_fail(ev) {
    this.setTask(ev.taskId, 'TASK_STATUS_FAILED');
    this.place(ev).append(h('div', { class: 'error-box' }, ev.error?.message || 'task failed'));
  },
};

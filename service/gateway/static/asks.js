// Questions to the user (permission, question, plan approval), answered through Submit:
// methods mixed into RunView (see render.js).

import { h, pretty } from './dom.js';

export const askHandlers = {
  askButtons(ev, id, title, choices) {
    const form = h('form', { class: 'ask-form', 'data-id': id });
    const row = h('div', { class: 'buttons' });
    for (const [label, payload] of choices) {
      row.append(h('button', { type: 'button', onclick: () => this.answer(ev, id, payload, form) },
        label));
    }
    form.append(row);
    const card = h('div', { class: 'card ask' }, h('div', { class: 'card-title' }, title), form);
    this.place(ev).append(card);
    this.blocks.set(id, { el: card, form });
  },

  on_permission_ask(ev) {
    this.askButtons(ev, ev.permissionId, `Allow ${ev.toolName}(${ev.arguments || ''})?`, [
      ['Allow', { allowed: true }], ['Deny', { allowed: false }]]);
  },
  on_permission_answer(ev) {
    this.settle(ev.permissionId, `${ev.allowed ? 'allowed' : 'denied'} (${ev.reason || 'user'})`);
  },
  on_question_ask(ev) {
    const options = ev.options || [];
    if (options.length) {
      this.askButtons(ev, ev.questionId, ev.question, options.map((o) => [o, o]));
      return;
    }
    const input = h('input', { name: 'answer', 'aria-label': 'Answer' });
    const form = h('form', { class: 'ask-form' }, input,
      h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Answer')));
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.answer(ev, ev.questionId, input.value, form);
    });
    const card = h('div', { class: 'card ask' }, h('div', { class: 'card-title' }, ev.question), form);
    this.place(ev).append(card);
    this.blocks.set(ev.questionId, { el: card, form });
  },
  on_question_answer(ev) {
    this.settle(ev.questionId, ev.timedOut ? 'no answer (timed out)' : `answer: ${pretty(ev.answer)}`);
  },

  settle(id, text) {
    const block = this.blocks.get(id);
    if (!block) return;
    block.form?.remove();
    block.el.append(h('div', { class: 'note' }, text));
  },
};

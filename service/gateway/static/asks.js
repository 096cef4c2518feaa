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
  /** A question: plain labels are buttons; typed options (with descriptions, the
   *  recommended one marked and preselected), several choices or the user's own words
   *  make a form — radio buttons or checkboxes, and a text field. */
  on_question_ask(ev) {
    const options = ev.options || [];
    const choices = new Map((ev.choices || []).map((c) => [c.label, c]));
    if (options.length && !choices.size && !ev.multiSelect && !ev.allowFreeText) {
      this.askButtons(ev, ev.questionId, ev.question, options.map((o) => [o, o]));
      return;
    }
    const type = ev.multiSelect ? 'checkbox' : 'radio';
    const list = h('div', { class: 'choices' }, ...options.map((label) => {
      const choice = choices.get(label) || {};
      return h('label', { class: 'choice' },
        h('input', { type, name: `answer-${ev.questionId}`, value: label, checked: !!choice.recommended }),
        h('span', { class: 'choice-label' }, label),
        choice.recommended ? h('span', { class: 'recommended' }, 'recommended') : null,
        choice.description ? h('span', { class: 'note' }, choice.description) : null);
    }));
    const free = ev.allowFreeText || !options.length;
    const own = free ? h('input', {
      name: 'answer', type: 'text', 'aria-label': 'Your own answer',
      placeholder: options.length ? 'or in your own words' : '',
    }) : null;
    const form = h('form', { class: 'ask-form question-form', 'data-id': ev.questionId },
      list, own, h('div', { class: 'buttons' },
        h('button', { type: 'submit', class: 'primary' }, 'Answer')));
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      const chosen = [...list.querySelectorAll('input:checked')].map((input) => input.value);
      const words = own ? own.value.trim() : '';
      if (ev.multiSelect) {
        this.answer(ev, ev.questionId, words ? [...chosen, words] : chosen, form);
      } else if (words || chosen.length || !options.length) {
        this.answer(ev, ev.questionId, words || chosen[0] || '', form);
      }
    });
    const card = h('div', { class: 'card ask', 'data-question-id': ev.questionId },
      h('div', { class: 'card-title' }, ev.question), form);
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

// Questions to the user (permission, question, plan approval), answered through Submit:
// methods mixed into RunView (see render.js). A question with one answer among options
// is a button per option (one click answers it); several answers make a form.

import { h, pretty } from './dom.js';

export const askHandlers = {
  /** Buttons that answer `id` at one click: `choices` are [label, payload, described?]. */
  askButtons(ev, id, title, choices, extra = null) {
    const form = h('form', { class: 'ask-form', 'data-id': id });
    const row = h('div', { class: 'buttons options' });
    for (const [label, payload, choice] of choices) {
      row.append(h('button', {
        type: 'button',
        class: choice?.recommended ? 'option recommended' : 'option',
        'data-option': label,
        title: choice?.description || null,
        onclick: () => this.answer(ev, id, payload, form),
      }, h('span', { class: 'choice-label' }, label),
      choice?.recommended ? h('span', { class: 'recommended' }, 'recommended') : null,
      choice?.description ? h('span', { class: 'note' }, choice.description) : null));
    }
    form.append(row);
    if (extra) form.append(extra(form));
    const card = h('div', { class: 'card ask' }, h('div', { class: 'card-title' }, title), form);
    this.place(ev).append(card);
    this.blocks.set(id, { el: card, form });
  },

  on_permission_ask(ev) {
    this.askButtons(ev, ev.permissionId, `Allow ${ev.toolName}(${ev.arguments || ''})?`, [
      ['Allow', { allowed: true }], ['Deny', { allowed: false }]]);
    this.waiting(ev.permissionId, true);
  },
  on_permission_answer(ev) {
    this.settle(ev.permissionId, `${ev.allowed ? 'allowed' : 'denied'} (${ev.reason || 'user'})`);
    this.waiting(ev.permissionId, false);
  },
  /** A question: with one answer among options, a button per option (its description
   *  under its label, the recommended one marked), and a field for one's own words when
   *  they are allowed; with several answers a form of checkboxes (the recommended one
   *  preselected) and that field; with no options, the field alone. */
  on_question_ask(ev) {
    this.waiting(ev.questionId, true);
    const options = ev.options || [];
    const choices = new Map((ev.choices || []).map((c) => [c.label, c]));
    if (options.length && !ev.multiSelect) {
      const own = ev.allowFreeText ? (form) => this.ownWords(ev, form) : null;
      this.askButtons(ev, ev.questionId, ev.question,
        options.map((o) => [o, o, choices.get(o)]), own);
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
    this.waiting(ev.questionId, false);
  },

  /** A field for the user's own words under a question's buttons, sent by Enter or its
   *  button (never empty). */
  ownWords(ev, form) {
    const words = h('input', {
      name: 'answer', type: 'text', 'aria-label': 'Your own answer', placeholder: 'or in your own words',
    });
    form.addEventListener('submit', (e) => {
      e.preventDefault();
      if (words.value.trim()) this.answer(ev, ev.questionId, words.value.trim(), form);
    });
    return h('div', { class: 'own-words' }, words,
      h('button', { type: 'submit', class: 'primary' }, 'Answer'));
  },

  settle(id, text) {
    const block = this.blocks.get(id);
    if (!block) return;
    block.form?.remove();
    block.el.append(h('div', { class: 'note' }, text));
  },
};

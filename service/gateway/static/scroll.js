// Keeps the chat log at its latest output while the reader is there, and leaves it where
// it is when the reader has scrolled up to read: new output then shows a "↓ new output"
// button that jumps to the latest. Back at the bottom (by scrolling or by the button),
// the log follows again.

/** How close to the bottom (px) still counts as being there. */
const SLACK = 32;

export class ScrollFollower {
  /** `box`: the scrolling log; `button`: the hidden-by-default jump button. */
  constructor(box, button) {
    this.box = box;
    this.button = button;
    this.following = true;
    this.height = box.scrollHeight; // the log's height when last looked at
    box.addEventListener('scroll', () => this.onScroll(), { passive: true });
    button.addEventListener('click', () => this.toLatest());
    // Output arrives as DOM changes (new blocks, text deltas, a frame's new height) and
    // the log's own size changes with the window: after each, follow or offer the button.
    new MutationObserver(() => this.onChange()).observe(box, {
      childList: true, subtree: true, characterData: true, attributes: true,
    });
    new ResizeObserver(() => this.onChange()).observe(box);
  }

  /** How far the view is above the bottom of a log `height` px high. */
  distance(height = this.box.scrollHeight) {
    return height - this.box.scrollTop - this.box.clientHeight;
  }

  onScroll() {
    this.height = this.box.scrollHeight;
    this.following = this.distance() <= SLACK;
    if (this.following) this.button.hidden = true;
  }

  onChange() {
    // Measured against the height before this change too: a reader who scrolled up a
    // moment ago (its scroll event still to come) is not pulled back down, and one at the
    // bottom of a log that shrank (a card folded) is still there.
    const grew = this.box.scrollHeight > this.height;
    if (this.following && (this.distance(this.height) <= SLACK || this.distance() <= SLACK)) {
      this.box.scrollTop = this.box.scrollHeight;
    } else {
      this.following = false;
      if (grew && this.distance() > SLACK) this.button.hidden = false;
    }
    this.height = this.box.scrollHeight;
  }

  /** Jumps to the latest output and follows it again (the button; a new chat or message). */
  toLatest() {
    this.following = true;
    this.button.hidden = true;
    this.box.scrollTop = this.box.scrollHeight;
    this.height = this.box.scrollHeight;
  }
}

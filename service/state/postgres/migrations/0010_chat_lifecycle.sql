-- Chats renamed, searched by name, deleted and expired (README "Chat lifecycle"): the sweep of
-- expired chats reads them by their last change, whoever owns them. Numbered apart from the
-- migrations of other work, which may take the numbers before it.
CREATE INDEX chats_by_updated ON chats (updated_at);

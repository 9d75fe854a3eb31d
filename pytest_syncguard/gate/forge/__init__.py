"""The forges a change's comment is posted to, each a :class:`.base.Forge` (its facts: names, pages, the body's
limit) and a :class:`.base.Comments` (its calls): GitHub through ``gh`` (:mod:`.github`), GitLab through its REST
API (:mod:`.gitlab`); one comment per key on any of them (:mod:`.comment`)."""

"""Trinity-RFT's ``ExperienceModel``: the SQL experience store's rows as SQLAlchemy objects,
so the FAQ's script reads a run's database unchanged::

    sess.query(ExperienceModel).limit(4).all() -> [ExperienceModel.to_experience(row), ...]

The table is the one the buffer writes (:data:`storage.sql.experiences`, ``experience_buffer``).
"""

from __future__ import annotations

from sqlalchemy.orm import declarative_base

from schemas.codec import decode
from schemas.data import Experience as OurExperience
from storage.sql import experiences, row
from trinity.common.experience import Experience, from_ours, to_ours

Base = declarative_base()


class ExperienceModel(Base):  # type: ignore[misc,valid-type]
    """One row of the SQL experience store."""

    __table__ = experiences

    def to_experience(self) -> Experience:
        """The row as Trinity-RFT's Experience (``prompt_text``, ``response_text``, tokens...)."""
        exp = from_ours(decode(self.experience_bytes, expect=OurExperience))
        exp.eid.task = self.task_id
        exp.eid.run = self.run_id or 0
        exp.eid.suffix = self.msg_id
        exp.reward = self.reward
        exp.info["model_version"] = self.model_version
        return exp

    @classmethod
    def from_experience(cls, experience: Experience | OurExperience) -> ExperienceModel:
        """A row for an experience (ids from ``eid`` when it has none of ours)."""
        ours = to_ours(experience, "ExperienceModel.from_experience")
        if not isinstance(experience, OurExperience):
            ours.task_id = str(experience.eid.task)
        return cls(**row(ours))

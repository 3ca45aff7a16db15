"""The synchronizer role: the process that publishes the sync plan and referees timeouts
(``main``). How weights move, and the trainer's and explorer's ends of it, are
:mod:`roles.weightsync`."""
